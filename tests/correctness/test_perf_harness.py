"""The perf harness in conftest.py: OOM becomes a skip, extra_info is filled, storage per GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from systems.bench.hardware import device_slug

pytest_plugins = ["pytester"]
ROOT_CONFTEST = Path(__file__).resolve().parents[2] / "conftest.py"

PERF_MODULE = '''
import torch
from dataclasses import dataclass

@dataclass(frozen=True)
class Case:
    id: str
    fail_with_oom: bool

def perf_cases(profile):
    return [Case(f"{profile}-ok", False), Case(f"{profile}-oom", True)]

def test_case(perf_case, synced_benchmark):
    def step():
        if perf_case.fail_with_oom:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
        torch.randn(64, 64) @ torch.randn(64, 64)
    synced_benchmark(step, warmup=1, rounds=3, precision="fp32", flops=2 * 64**3, tokens=64,
                     info={"size": "toy"}, cold_start=True)
'''


@pytest.fixture
def perf_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # pytest-benchmark disables itself when it sees xdist's variables (we may run under -n).
    for name in [k for k in os.environ if k.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile(test_toy_perf=PERF_MODULE)
    return pytester


def test_oom_is_a_skip_with_reason_and_results_carry_throughput(perf_project) -> None:
    result = perf_project.runpytest("--perf-profile=smoke", "-rs", "--benchmark-json=out.json")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*out of memory (a property of this workload)*80 GiB*"])
    result.stdout.fnmatch_lines(["*throughput*", "*test_case?smoke-ok?*"])
    (bench,) = json.loads((perf_project.path / "out.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    assert bench["stats"]["rounds"] == 3
    assert info["size"] == "toy" and info["precision"] == "fp32" and info["warmup_rounds"] == 1
    assert info["cold_start_s"] > 0
    # On the CPU a step is done when it returns: enqueue time is the whole round.
    assert 0 < info["host_enqueue_s_median"] <= bench["stats"]["max"]
    assert info["tflops"] == pytest.approx(2 * 64**3 / bench["stats"]["mean"] / 1e12)
    assert info["tokens_per_s"] == pytest.approx(64 / bench["stats"]["mean"])


def test_profile_selects_the_cases(perf_project) -> None:
    result = perf_project.runpytest("--perf-profile=full", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_case?full-ok?*", "*test_case?full-oom?*"])


def test_saved_history_is_kept_per_device_with_versions(perf_project) -> None:
    perf_project.runpytest("--perf-profile=smoke", "--benchmark-autosave", "-k", "ok")
    (saved,) = (perf_project.path / ".benchmarks" / device_slug()).glob("*/*.json")
    machine = json.loads(saved.read_text())["machine_info"]
    assert {"device_name", "torch", "cuda", "triton"} <= machine.keys()
