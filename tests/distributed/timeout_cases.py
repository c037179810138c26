"""Run by test_rank_pool.py in a child pytest: pytest-timeout cuts a test mid-call.

The pool is started first, so the timeout hits a call, not the start-up. The test after
the cut one must get its own results from `run_on_ranks`, not the cut call's.
"""

from __future__ import annotations

import time

import pytest


def sleep_then_return(seconds: float, value: str) -> str:
    time.sleep(seconds)
    return value


@pytest.mark.timeout(120)
def test_start_the_pool(run_on_ranks):
    assert run_on_ranks(sleep_then_return, 0, "start") == ["start"] * 2


@pytest.mark.timeout(2)
def test_cut_by_the_timeout(run_on_ranks):
    run_on_ranks(sleep_then_return, 6, "first call")


@pytest.mark.timeout(120)
def test_gets_its_own_results(run_on_ranks):
    assert run_on_ranks(sleep_then_return, 0, "second call") == ["second call"] * 2
