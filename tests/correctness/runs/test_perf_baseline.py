"""Every case the quick profile runs has a result in the committed baseline of its GPU.

Adding or renaming a perf case changes what the gate compares: this test then fails until
the baseline is recorded again (`make baseline` on that GPU, see docs/benchmarking.md).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from systems.runs.baseline import (
    BASELINE_PARTS_1GPU,
    JsonDestination,
    baseline_path,
    baseline_problems,
    baseline_suite,
    json_destination_path,
    missing_cases,
)

ROOT = Path(__file__).resolve().parents[3]

# Which committed baseline gates which perf modules: single-GPU suites on one H100 and on
# one H200, the distributed suite on two and four H200 (its case list depends on the GPU
# count).
SINGLE_GPU_MODULES = ("test_end_to_end.py", "test_training_recipes.py", "test_attention.py")
BASELINES = {
    "H100 (1 GPU)": ("NVIDIA_H100_80GB_HBM3", 1, SINGLE_GPU_MODULES),
    "H200 (1 GPU)": ("NVIDIA_H200", 1, SINGLE_GPU_MODULES),
    "2 x H200": ("NVIDIA_H200", 2, ("test_distributed.py",)),
    "4 x H200": ("NVIDIA_H200", 4, ("test_distributed.py",)),
}

# Collects tests/perf's quick profile as a host with `gpus` GPUs would, without running it;
# prints the node ids of the cases that would run (empty parameter sets are skips).
_COLLECT = """
import json, sys
import pytest
import systems.common.hardware as hardware
gpus = int(sys.argv[1])
hardware.gpu_count = lambda: gpus

class Collect:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items
                    if not item.get_closest_marker("skip")]

plugin = Collect()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--perf-profile=quick",
                    *sys.argv[2:]], plugins=[plugin])
print("COLLECTED " + json.dumps(plugin.ids))
sys.exit(code)
"""


def quick_case_ids(gpus: int, modules: tuple[str, ...]) -> list[str]:
    return [i for i in _all_quick_case_ids(gpus) if i.split("::")[0].split("/")[-1] in modules]


@functools.cache
def _all_quick_case_ids(gpus: int, *selection: str) -> tuple[str, ...]:
    """Node ids of the quick profile's cases under `selection` (pytest arguments; default
    all of tests/perf) on a host with `gpus` GPUs."""
    result = subprocess.run(
        [sys.executable, "-c", _COLLECT, str(gpus), *(selection or ("tests/perf",))],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""},
    )
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("COLLECTED ")] or [
        pytest.fail(f"collecting the quick profile failed:\n{result.stdout}\n{result.stderr}")]
    return tuple(json.loads(line[len("COLLECTED "):]))


def test_quick_profile_collection_follows_the_gpu_count() -> None:
    one, two = (quick_case_ids(n, ("test_distributed.py",)) for n in (1, 2))
    assert not any("test_train_step" in i for i in one)
    assert sum("test_train_step" in i for i in two) > 0
    assert all(i.startswith("tests/perf/test_distributed.py::") for i in one + two)
    # Empty parameter sets (the warm-up study outside `full`) are skips, not cases.
    assert not any("test_warmup_study" in i for i in quick_case_ids(1, ("test_end_to_end.py",)))


def test_problems_name_the_missing_cases_and_the_command(tmp_path: Path) -> None:
    expected = ["tests/perf/test_a.py::test_a[x]", "tests/perf/test_a.py::test_a[y]"]
    path = baseline_path(tmp_path, 1)
    (absent,) = baseline_problems(path, expected)
    assert str(path) in absent and "make baseline" in absent

    path.write_text(json.dumps({"benchmarks": [{"fullname": expected[0]}]}))
    assert missing_cases(expected, json.loads(path.read_text())) == [expected[1]]
    headline, listed = baseline_problems(path, expected)
    assert headline.startswith("1 case(s) have no result") and "make baseline" in headline
    assert listed.strip() == expected[1]

    path.write_text(json.dumps({"benchmarks": [{"fullname": n} for n in expected]}))
    assert baseline_problems(path, expected) == []


@pytest.mark.parametrize("kind", BASELINES)
def test_committed_baseline_covers_the_quick_profile(kind: str) -> None:
    slug, gpus, modules = BASELINES[kind]
    expected = quick_case_ids(gpus, modules)
    assert expected, f"the quick profile of {modules} is empty on {kind}"
    problems = baseline_problems(baseline_path(ROOT / ".benchmarks" / slug, gpus), expected)
    assert not problems, f"{kind}: " + "\n".join(problems)


def test_a_baseline_covers_the_suite_its_gpu_count_gates() -> None:
    # Keeps `make baseline` and the mapping above in step: one GPU gates the single-GPU
    # suites, several GPUs the distributed one.
    assert baseline_suite(1) == "tests/perf"
    assert baseline_suite(2) == baseline_suite(8) == "tests/perf/test_distributed.py"
    assert all(m == ("test_distributed.py",) for _, gpus, m in BASELINES.values() if gpus >= 2)


def test_json_destination_serves_both_pytest_benchmark_conventions(tmp_path: Path) -> None:
    # 5.3 opens the path it is given; 5.2 writes into the (file) object inside `with`.
    destination = JsonDestination(tmp_path / "run.json")
    with open(destination, "wb") as fh:
        fh.write(b'{"a": 1}')
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 1}
    with destination as fh:
        fh.write(b'{"b": 2}')
    assert json.loads((tmp_path / "run.json").read_text()) == {"b": 2}
    assert json_destination_path(destination) == tmp_path / "run.json"
    with open(tmp_path / "other.json", "wb") as handle:
        assert json_destination_path(handle) == tmp_path / "other.json"


def test_the_baseline_parts_select_every_single_gpu_case_once() -> None:
    """`python -m systems.runs.baseline part NAME`, for each part, then `combine`: the
    parts must add up to the profile a 1-GPU baseline covers, no case twice."""
    whole = _all_quick_case_ids(1)
    parts = {name: _all_quick_case_ids(1, *args) for name, args in BASELINE_PARTS_1GPU.items()}
    assert all(parts.values()), f"a part selects nothing: {parts}"
    selected = [case for ids in parts.values() for case in ids]
    assert len(selected) == len(set(selected)), "a case is in two parts"
    assert set(selected) == set(whole)
