"""Fixtures the correctness tests share."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from smoke_runs import save_smoke_runs

from systems.attention.flash_triton import launch
from systems.attention.gluon import backward as gluon_backward
from systems.attention.gluon import forward as gluon_forward
from systems.attention.host_path import replay


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Kernel outputs start as NaN, so an element a kernel forgets to write fails the test."""
    def new_nan(like, shape, dtype=None):
        return torch.full(shape, math.nan, dtype=dtype or like.dtype, device=like.device)

    monkeypatch.setattr(launch, "_new_empty", new_nan)
    monkeypatch.setattr(launch, "_empty_like",
                        lambda t, dtype=None: torch.full_like(t, math.nan, dtype=dtype))
    replay.set_poison(True)  # outputs of calls replayed from C++
    yield
    replay.set_poison(False)


@pytest.fixture
def poisoned_gluon_outputs(monkeypatch):
    """Every buffer the Gluon kernels write starts as NaN (as their `poison` flag does)."""
    original = gluon_backward.output_buffer

    def poisoned(shape, dtype, device, poison):
        return original(shape, dtype, device, True)

    for module in (gluon_backward, gluon_forward):
        monkeypatch.setattr(module, "output_buffer", poisoned)


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> Path:
    """Two real smoke runs saved by pytest-benchmark: fp32 and bf16 forward, then fp32 again
    (the fast cases, to keep the tests of history tools quick)."""
    storage = tmp_path_factory.mktemp("benchmarks")
    save_smoke_runs(storage, [("first", "tiny-ctx64-forward-"), ("second", "forward-fp32")])
    return storage


_CORRUPTIONS = {
    "truncated": lambda text: text[: len(text) // 2],
    "a list, not a run": lambda text: json.dumps([json.loads(text)]),
    "benchmarks not a list": lambda text: json.dumps({**json.loads(text), "benchmarks": {}}),
    "a benchmark without stats": lambda text: json.dumps(
        {**json.loads(text),
         "benchmarks": [{k: v for k, v in b.items() if k != "stats"}
                        for b in json.loads(text)["benchmarks"]]}),
    "stats without a mean": lambda text: json.dumps(
        {**json.loads(text),
         "benchmarks": [{**b, "stats": {"min": 1.0}} for b in json.loads(text)["benchmarks"]]}),
    "machine_info not a mapping": lambda text: json.dumps(
        {**json.loads(text), "machine_info": "H100"}),
}


@pytest.fixture(params=sorted(_CORRUPTIONS))
def storage_with_a_bad_run(request, smoke_runs, tmp_path) -> tuple[Path, Path]:
    """A copy of the smoke storage where the second run is corrupted one way."""
    storage = tmp_path / "benchmarks"
    for path in smoke_runs.rglob("*.json"):
        target = storage / path.relative_to(smoke_runs)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    bad = sorted(storage.rglob("*.json"))[-1]
    bad.write_text(_CORRUPTIONS[request.param](bad.read_text()))
    return storage, bad
