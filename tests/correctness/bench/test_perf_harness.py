"""The perf harness in conftest.py: OOM becomes a skip, extra_info is filled, storage per GPU,
plain params, the baseline as compare target, the gate, storage checks, the slowdown switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from systems.bench.params import flatten_case
from systems.bench.timing import SLOWDOWN_ENV, injected_slowdowns
from systems.common.hardware import device_slug
from systems.runs import keys
from systems.runs.baseline import baseline_path

pytest_plugins = ["pytester"]
ROOT_CONFTEST = Path(__file__).resolve().parents[3] / "conftest.py"

PERF_MODULE = '''
import gc

import torch
from dataclasses import dataclass

@dataclass(frozen=True)
class Case:
    id: str
    fail_with_oom: bool

def perf_cases(profile):
    return [Case(f"{profile}-ok", False), Case(f"{profile}-oom", True)]

def test_case(perf_case, synced_benchmark):
    collector_on = []
    def step():
        collector_on.append(gc.isenabled())
        if perf_case.fail_with_oom:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
        torch.randn(64, 64) @ torch.randn(64, 64)
    synced_benchmark(step, warmup=1, rounds=3, precision="fp32", flops=2 * 64**3, tokens=64,
                     info={"size": "toy"}, cold_start=True)
    # The first call and the warm-up run with the garbage collector, timed rounds without.
    assert collector_on == [True, True, False, False, False]
    assert gc.isenabled()
'''


def _as_a_cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner sessions run in this process: on a GPU host they would pick the GPU's
    storage, GPU count and machine info. These tests describe a CPU host wherever they run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def perf_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # pytest-benchmark disables itself when it sees xdist's variables (we may run under -n).
    for name in [k for k in os.environ if k.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
    _as_a_cpu_host(monkeypatch)
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
    assert info["timing"] == "wall"  # rounds of an eager step: what a caller waits for
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


# A perf module shaped like tests/perf/*: a dataclass case (with a nested dataclass and a
# tuple, as TrainCase and the attention cases have), steps that sleep long enough (0.1-0.3 s)
# for scheduling noise on a busy CPU to stay a few percent. The steps run on a stand-in
# accelerator, as the GPU suites' do: step() queues the work and returns, and the work runs
# in the synchronize. (Work on the CPU itself is the host's, which the gate leaves ungated.)
TIMED_MODULE = '''
import time
from dataclasses import dataclass

import pytest
import torch

from systems.bench import timing

@pytest.fixture
def device():
    return torch.device("meta")

@pytest.fixture(autouse=True)
def queued(monkeypatch):
    work = []

    def run_queued(device):
        while work:
            time.sleep(work.pop())

    monkeypatch.setattr(timing, "synchronize", run_queued)
    return work

@dataclass(frozen=True)
class Shape:
    seq_len: int
    dims: tuple

@dataclass(frozen=True)
class Case:
    size: str
    shape: Shape
    seconds: float

    @property
    def id(self):
        return f"{self.size}-n{self.shape.seq_len}"

def perf_cases(profile):
    return [Case("small", Shape(64, (2, 3)), 0.2), Case("large", Shape(128, (4, 5)), 0.3)]

def test_step(perf_case, synced_benchmark, queued):
    synced_benchmark(lambda: queued.append(perf_case.seconds), warmup=1, rounds=7,
                     precision="fp32")

@pytest.mark.benchmark(group="plain")
def test_plain(benchmark):
    benchmark.pedantic(time.sleep, args=(0.1,), rounds=5, iterations=1)
'''


@pytest.fixture
def timed_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in [k for k in os.environ if k.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv(SLOWDOWN_ENV, raising=False)
    monkeypatch.setenv("SYSTEMS_COMMIT", "0123abc")  # a gate target names its commit
    _as_a_cpu_host(monkeypatch)
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    perf = pytester.mkdir("tests").joinpath("perf")
    perf.mkdir()
    perf.joinpath("test_timed.py").write_text(TIMED_MODULE)
    return pytester


def storage(project: pytest.Pytester) -> Path:
    return project.path / ".benchmarks" / device_slug()


def test_saved_params_are_plain_and_group_by_a_param(timed_project) -> None:
    result = timed_project.runpytest("tests/perf", "-k", "test_step", "--benchmark-json=run.json",
                                     "--benchmark-group-by=param:size")
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(["*benchmark 'size=large': 1 tests*",
                                 "*benchmark 'size=small': 1 tests*"])
    saved = json.loads((timed_project.path / "run.json").read_text())
    by_name = {b["name"]: b for b in saved["benchmarks"]}
    step = by_name["test_step[small-n64]"]
    assert step["params"] == {"size": "small", "seconds": 0.2, "seq_len": 64, "dims": [2, 3]}
    assert step["param"] == "small-n64"
    assert "UNSERIALIZABLE" not in (timed_project.path / "run.json").read_text()
    # pytest-benchmark's own reader groups the saved run by a param, too.
    compared = subprocess.run(
        [sys.executable, "-c", "from pytest_benchmark.cli import main; main()", "compare",
         "--group-by", "param:seq_len", str(timed_project.path / "run.json")],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT_CONFTEST.parent / "src")})
    assert "seq_len=64" in compared.stdout and "seq_len=128" in compared.stdout


def test_flatten_case_keeps_outer_names_on_a_clash() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Step:
        warmup: int
        dims: tuple

    @dataclass(frozen=True)
    class Study:
        warmup: int
        step: Step

    assert flatten_case(Study(0, Step(2, (1, (2, 3))))) == {
        "warmup": 0, "step_warmup": 2, "dims": [1, [2, 3]]}
    with pytest.raises(TypeError, match="dataclass"):
        flatten_case({"warmup": 0})


def test_compare_without_a_baseline_says_how_to_record_one(timed_project) -> None:
    # A saved run exists, but only a baseline is ever the default compare target.
    timed_project.runpytest("tests/perf", "--benchmark-autosave").assert_outcomes(passed=3)
    result = timed_project.runpytest("tests/perf", "--benchmark-compare")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["nothing compared: no baseline for *record one with "
                                 "`make baseline`"])
    assert "Comparing against" not in result.stdout.str() + result.stderr.str()
    assert "Can't compare" not in result.stdout.str() + result.stderr.str()


def test_baseline_is_the_default_compare_target_and_studies_never_are(timed_project,
                                                                     recwarn) -> None:
    result = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline")
    result.assert_outcomes(passed=3)
    baseline = baseline_path(storage(timed_project), 0)
    result.stdout.fnmatch_lines([f"recorded the baseline {baseline} (3 cases)*"])
    assert {b["name"] for b in json.loads(baseline.read_text())["benchmarks"]} == {
        "test_step[small-n64]", "test_step[large-n128]", "test_plain"}

    timed_project.runpytest("tests/perf", "-k", "small", "--perf-study=sweep",
                            "--benchmark-autosave").assert_outcomes(passed=1, deselected=2)
    (study,) = (storage(timed_project) / "studies").glob("*.json")
    assert study.name == "0001_sweep.json"

    result = timed_project.runpytest("tests/perf", "--benchmark-compare", "-s")
    result.assert_outcomes(passed=3)
    assert f"Comparing against benchmarks from: {baseline.name}" in result.stderr.str()
    # The same machine: its host speed, which differs every run, is no machine difference.
    assert not [w for w in recwarn if "machine_info is different" in str(w.message)]


@pytest.mark.parametrize("args", [["-k", "small"], ["--perf-profile=smoke"],
                                  ["--benchmark-disable"]])
def test_a_partial_run_can_never_become_the_baseline(timed_project, args) -> None:
    result = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline",
                                     *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--perf-baseline records the complete quick profile" in result.stderr.str()
    assert not baseline_path(storage(timed_project), 0).exists()


def test_a_failing_run_leaves_the_baseline_alone(timed_project) -> None:
    timed_project.path.joinpath("tests/perf/test_broken.py").write_text(
        "def test_broken(benchmark):\n    benchmark(lambda: 1 / 0)\n")
    result = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["baseline NOT recorded*"])
    assert not list(storage(timed_project).glob("*.json"))


def test_repeats_pool_into_the_baseline_of_the_same_commit(timed_project, monkeypatch):
    monkeypatch.setenv("SYSTEMS_COMMIT", "abc1234")
    refused = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline",
                                      "--perf-baseline-repeat")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR  # nothing to add to yet
    assert "--perf-baseline-repeat needs a baseline" in refused.stderr.str()
    alone = timed_project.runpytest("tests/perf", "--perf-profile=quick",
                                    "--perf-baseline-repeat")
    assert alone.ret == pytest.ExitCode.USAGE_ERROR  # it would otherwise save nothing
    assert "give it with --perf-baseline" in alone.stderr.str()

    for _ in range(2):
        timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline",
                                *(["--perf-baseline-repeat"] if _ else [])
                                ).assert_outcomes(passed=3)
    baseline = baseline_path(storage(timed_project), 0)
    pooled = json.loads(baseline.read_text())
    # The named commit, without the times of whatever commit the checkout's .git holds.
    assert pooled["commit_info"]["id"] == "abc1234"
    assert pooled["commit_info"]["time"] is None is pooled["commit_info"]["author_time"]
    benches = {b["name"]: b for b in pooled["benchmarks"]}
    large = benches["test_step[large-n128]"]
    assert large["stats"]["rounds"] == 14 == len(large["stats"]["data"])  # 7 rounds per run
    assert len(large["extra_info"]["run_medians"]) == 2
    assert large["extra_info"]["run_medians"] == pytest.approx([0.3, 0.3], rel=0.1)
    probes = pooled["machine_info"][keys.HOST_PYTHON_LOOP_MS_RUNS]  # each run's host speed
    assert len(probes) == 2 and all(ms > 0 for ms in probes)
    assert not list(storage(timed_project).glob(".*draft*"))

    monkeypatch.setenv("SYSTEMS_COMMIT", "def5678")  # another commit: never pooled
    other = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline",
                                    "--perf-baseline-repeat")
    assert other.ret == pytest.ExitCode.TESTS_FAILED
    other.stdout.fnmatch_lines(["baseline NOT extended (a repeat must match the baseline's "
                                "commit_info.id*"])
    assert json.loads(baseline.read_text())["benchmarks"][0]["extra_info"]["run_medians"]


def test_on_several_gpus_the_one_gpu_baseline_gates_the_single_gpu_suites(timed_project,
                                                                         monkeypatch):
    import systems.bench.pytest_plugin as plugin

    monkeypatch.setattr(plugin, "gpu_count", lambda: 1)
    timed_project.runpytest("tests/perf", "--perf-profile=quick",
                            "--perf-baseline").assert_outcomes(passed=3)
    one_gpu = baseline_path(storage(timed_project), 1)
    monkeypatch.setattr(plugin, "gpu_count", lambda: 2)
    alone = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-gate")
    alone.stdout.fnmatch_lines([f"*perf gate: vs {one_gpu} (commit 0123abc)*"])
    assert "not run" not in alone.stdout.str() and "new (no baseline)" not in alone.stdout.str()

    # With a two-GPU baseline (the distributed suite's cases) both gate, that one first.
    two_gpu = baseline_path(storage(timed_project), 2)
    distributed = json.loads(one_gpu.read_text())
    for bench in distributed["benchmarks"]:
        bench["fullname"] = bench["fullname"].replace("test_step", "test_ranks")
    two_gpu.write_text(json.dumps(distributed))
    both = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-gate")
    both.stdout.fnmatch_lines([f"*perf gate: vs {two_gpu} (commit 0123abc), {one_gpu} "
                               "(commit 0123abc)*",
                               f"{two_gpu.name}: host speed: *", f"{one_gpu.name}: host speed: *"])
    assert "new (no baseline)" not in both.stdout.str()  # every case run has a baseline
    assert both.stdout.str().count("not run") >= 2  # the two-GPU baseline's own cases
    assert both.ret == pytest.ExitCode.OK


def test_a_malformed_gate_target_fails_before_any_case_runs(timed_project) -> None:
    baseline = baseline_path(storage(timed_project), 0)
    baseline.parent.mkdir(parents=True, exist_ok=True)
    baseline.write_text('{"benchmarks": [')  # truncated
    result = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-gate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # refused at configure: nothing ran
    assert f"--perf-gate: {baseline}: not a benchmark run" in result.stderr.str()


def test_gate_passes_a_rerun_and_a_host_slowdown_behind_device_work(timed_project, monkeypatch):
    timed_project.runpytest("tests/perf", "--perf-profile=quick",
                            "--perf-baseline").assert_outcomes(passed=3)
    rerun = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-gate")
    rerun.stdout.fnmatch_lines(["*perf gate: vs *baseline_0gpu.json (commit 0123abc)*",
                                "host speed: a fixed Python loop took * ms in this run, "
                                "* ms in the baseline's run (*); host-bound eager cases "
                                "can move with it",
                                "case*baseline ms*current ms*change*threshold*verdict*"])
    assert "SLOWER" not in rerun.stdout.str()
    assert rerun.ret == pytest.ExitCode.OK

    # A slower host alone: these steps' work runs at the synchronize (a stand-in device),
    # so the host's extra time per call hides behind it and no clock blames the work.
    monkeypatch.setenv(SLOWDOWN_ENV, "test_step:0.5")
    slowed = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-gate",
                                     "--benchmark-json=slowed.json")
    assert slowed.ret == pytest.ExitCode.OK
    slowed.stdout.fnmatch_lines([f"*{SLOWDOWN_ENV}*set*NOT real measurements*",
                                 "*::test_step?large-n128?*wall*ok"])
    assert "SLOWER" not in slowed.stdout.str()
    benches = json.loads((timed_project.path / "slowed.json").read_text())["benchmarks"]
    injected = {b["name"]: b["extra_info"].get(keys.INJECTED_HOST) for b in benches}
    assert injected == {"test_step[small-n64]": 0.5, "test_step[large-n128]": 0.5,
                        "test_plain": None}
    step = next(b for b in benches if b["name"] == "test_step[large-n128]")
    assert len(step["extra_info"][keys.HOST_ENQUEUE_ROUNDS_S]) == 7
    assert step["stats"]["median"] == pytest.approx(0.3, rel=0.1)

    monkeypatch.setenv(SLOWDOWN_ENV, "test_step:0.5")
    refused = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-baseline")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR


def test_slowdown_switch_reads_name_and_fraction() -> None:
    assert injected_slowdowns(None) == {}
    assert injected_slowdowns("test_end_to_end:0.15, test_x:1") == {
        "test_end_to_end": 0.15, "test_x": 1.0}
    for bad in ("test_end_to_end", "test_end_to_end:fast", ":0.1", "test_x:0", "test_x:-1"):
        with pytest.raises(ValueError, match="test_name:fraction"):
            injected_slowdowns(bad)


def test_unwritable_storage_fails_before_any_case_runs(timed_project) -> None:
    blocker = timed_project.path / "a_file"
    blocker.write_text("not a folder")
    result = timed_project.runpytest("tests/perf", "--benchmark-autosave",
                                     f"--benchmark-storage=file://{blocker / 'history'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"cannot write in {blocker / 'history'}" in result.stderr.str()
    assert "passed" not in result.stdout.str()


def test_tables_print_even_when_saving_fails_at_the_end(timed_project) -> None:
    # The storage is fine at the start and gone (a file in its place) when results are saved.
    timed_project.path.joinpath("tests/perf/test_zz_breaks_storage.py").write_text(
        "import shutil\nfrom pathlib import Path\n"
        "def test_breaks_storage(request):\n"
        "    folder = Path(request.config.option.benchmark_storage[len('file://'):])\n"
        "    shutil.rmtree(folder)\n"
        "    folder.write_text('in the way')\n")
    result = timed_project.runpytest("tests/perf", "--benchmark-autosave")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*throughput*", "*test_step?large-n128?*",
                                 "SAVING FAILED, results were not stored:*"])


def test_commit_override_goes_through_the_commit_info_hook(timed_project, monkeypatch):
    monkeypatch.setenv("SYSTEMS_COMMIT", "abc1234")
    timed_project.runpytest("tests/perf", "-k", "plain", "--benchmark-json=run.json")
    saved = json.loads((timed_project.path / "run.json").read_text())
    assert saved["commit_info"]["id"] == "abc1234" and saved["commit_info"]["error"] is None
    assert saved["commit_info"]["dirty"] is False
    assert saved["benchmarks"][0]["group"] == "plain"  # from @pytest.mark.benchmark
    assert saved["machine_info"]["cudnn"] is None and "nccl" in saved["machine_info"]


def _recorded_baseline(project: pytest.Pytester) -> Path:
    project.runpytest("tests/perf", "--perf-profile=quick",
                      "--perf-baseline").assert_outcomes(passed=3)
    return baseline_path(storage(project), 0)


@pytest.mark.parametrize("damage", ["median 0", "NaN iqr", "no median", "another GPU"])
def test_a_baseline_the_validator_refuses_stops_the_gate_before_any_case_runs(
        timed_project, damage) -> None:
    baseline = _recorded_baseline(timed_project)
    saved = json.loads(baseline.read_text())
    stats = saved["benchmarks"][0]["stats"]
    if damage == "median 0":
        stats["median"] = 0.0
    elif damage == "NaN iqr":
        stats["iqr"] = float("nan")
    elif damage == "no median":
        del stats["median"]
    else:
        saved["machine_info"]["device_name"] = "NVIDIA H200"
    baseline.write_text(json.dumps(saved))
    for args in (["--perf-gate"], ["--benchmark-compare"]):
        result = timed_project.runpytest("tests/perf", "--perf-profile=quick", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, args
        assert str(baseline) in result.stderr.str()
        assert "passed" not in result.stdout.str()


def test_a_gate_that_compares_nothing_is_an_unusable_input(timed_project) -> None:
    baseline = _recorded_baseline(timed_project)
    saved = json.loads(baseline.read_text())
    for bench in saved["benchmarks"]:
        bench["fullname"] += "_renamed"
    baseline.write_text(json.dumps(saved))
    result = timed_project.runpytest("tests/perf", "--perf-profile=quick", "--perf-gate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["the gate compared nothing: no case of this run is in*"])


def test_a_json_destination_that_cannot_be_written_fails_before_any_case_runs(
        timed_project) -> None:
    blocker = timed_project.path / "a_file"
    blocker.write_text("not a folder")
    result = timed_project.runpytest("tests/perf", f"--benchmark-json={blocker / 'run.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "benchmark results could not be saved" in result.stderr.str()
    assert "passed" not in result.stdout.str()
