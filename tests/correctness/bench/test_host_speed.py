"""The host speed probe (systems.common.host_speed): a positive time that grows with the
work it times."""

from __future__ import annotations

import math

import pytest

from systems.common.host_speed import python_loop_ms


def test_probe_is_a_positive_finite_time() -> None:
    ms = python_loop_ms()
    assert ms > 0 and math.isfinite(ms)


def test_probe_grows_with_the_work() -> None:
    # Eight times the loop: even if the host's speed moved by half between the two calls,
    # the longer loop's median would stay above twice the shorter one's.
    short = python_loop_ms(length=25_000, repeats=5)
    long = python_loop_ms(length=200_000, repeats=5)
    assert long > 2 * short


@pytest.mark.parametrize("bad", [{"length": 0}, {"repeats": 0}])
def test_probe_refuses_an_empty_workload(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        python_loop_ms(**bad)
