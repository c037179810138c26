"""The shard runner (`systems.runs.shards`): the GPU-test shards select every GPU-marked test
once, a passed shard is not run again at the same code, the deadline leaves shards for the
next call, and a failing or overrunning shard is reported, not hidden."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from systems.runs import shards
from systems.runs.shards import (
    GPU_TEST_ARGS,
    GPU_TEST_SHARDS,
    INCOMPLETE,
    Shard,
    ShardState,
    closing_line,
    code_key,
    gpu_baseline_shards,
    run_command,
    run_suite,
)

REPO = Path(__file__).resolve().parents[3]


def _collected(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "gpu", *args],
        cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode in (0, 5), result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_the_gpu_test_shards_select_every_gpu_marked_test_once():
    every = _collected("tests/correctness", "tests/distributed")
    assert len(every) > 100  # the GPU suite, not an empty selection
    selected = [test for paths, _ in GPU_TEST_SHARDS.values() for test in _collected(*paths)]
    assert sorted(selected) == sorted(every)  # each once: a test in two shards shows twice
    assert "-m" in GPU_TEST_ARGS and "gpu" in GPU_TEST_ARGS


def _defines(files: str, function: str) -> bool:
    """Whether one of the space-separated test files defines `function`."""
    return any(f"def {function}(" in (REPO / name).read_text() for name in files.split())


def _fake_runner(outcomes: dict[str, int | None], ran: list[str], seconds: float = 30.0):
    """A runner that writes a pytest-like log and returns `outcomes[shard]` (by log name)."""
    def runner(argv, env, log: Path, limit_s):
        name = log.stem
        ran.append(name)
        code = outcomes.get(name, 0)
        log.write_text(f"stuff\n===== 3 passed, 1 skipped in {seconds}s =====\n")
        return code, seconds
    return runner


def _shards(*names: str, minutes: float = 1.0, **extra) -> list[Shard]:
    return [Shard(name, lambda: ["true"], minutes, **extra) for name in names]


def test_a_shard_that_passed_is_not_run_again_at_the_same_code(tmp_path):
    state = ShardState(tmp_path, "gpu-test", "k" * 64)
    lines: list[str] = []
    ran: list[str] = []
    outcomes = {"b": 1}
    code = run_suite("gpu-test", _shards("a", "b", "c"), state,
                     runner=_fake_runner(outcomes, ran), echo=lines.append)
    assert code == 1 and ran == ["a", "b", "c"]  # a failure does not stop the others
    assert any("[gpu-test 2/3] b: failed" in line for line in lines)
    assert any("failed: b" in line for line in lines)
    ran.clear()
    outcomes["b"] = 0
    assert run_suite("gpu-test", _shards("a", "b", "c"), state,
                     runner=_fake_runner(outcomes, ran), echo=lines.append) == 0
    assert ran == ["b"]
    assert "3/3 shards passed" in lines[-1]
    # Spent on this code in all: a, b twice (the failed run too), c, at 30 s each.
    assert "0.5 GPU-min this run, 2.0 GPU-min in all" in lines[-1]


def test_another_code_key_runs_every_shard_again(tmp_path):
    ran: list[str] = []
    for key in ("a" * 64, "b" * 64):
        run_suite("gpu-test", _shards("x"), ShardState(tmp_path, "gpu-test", key),
                  runner=_fake_runner({}, ran), echo=lambda line: None)
    assert ran == ["x", "x"]


def test_the_deadline_leaves_shards_for_the_next_call(tmp_path):
    state = ShardState(tmp_path, "gpu-baseline", "k" * 64)
    now = [0.0]

    def runner(argv, env, log, limit_s):
        now[0] += 240
        log.write_text("== 1 passed in 240.0s ==\n")
        return 0, 240.0

    lines: list[str] = []
    code = run_suite("gpu-baseline", _shards("a", "b", "c", minutes=4), state,
                     deadline_s=500, runner=runner, clock=lambda: now[0], echo=lines.append)
    assert code == INCOMPLETE  # a and b fit in 500 s, c (4 more minutes) would not
    assert any("c: not started" in line for line in lines)
    assert "run the same command again" in lines[-1]
    code = run_suite("gpu-baseline", _shards("a", "b", "c", minutes=4), state,
                     deadline_s=500, runner=runner, clock=lambda: now[0], echo=lines.append)
    assert code == 0


def test_a_shard_waits_for_the_shards_it_needs(tmp_path):
    state = ShardState(tmp_path, "gpu-baseline", "k" * 64)
    ran: list[str] = []
    suite = [*_shards("part"), Shard("combine", lambda: ["true"], 0.1, needs=("part",))]
    lines: list[str] = []
    code = run_suite("gpu-baseline", suite, state, runner=_fake_runner({"part": 1}, ran),
                     echo=lines.append)
    assert code == 1 and ran == ["part"]
    assert any("combine: not run: needs part" in line for line in lines)


def test_an_expected_failure_counts_as_passed_and_any_other_exit_not(tmp_path):
    state = ShardState(tmp_path, "gpu-baseline", "k" * 64)
    ran: list[str] = []
    injected = _shards("injected_ok", "injected_quiet", expect=1)
    code = run_suite("gpu-baseline", injected, state,
                     runner=_fake_runner({"injected_ok": 1, "injected_quiet": 0}, ran),
                     echo=lambda line: None)
    assert code == 1
    assert state.get("injected_ok").status == "passed"
    assert state.get("injected_quiet").status == "failed"


def test_a_shard_past_its_limit_is_stopped_and_recorded(tmp_path):
    log = tmp_path / "slow.log"
    code, seconds = run_command([sys.executable, "-c", "import time; time.sleep(30)"], {},
                                log, limit_s=0.5)
    assert code is None and seconds < 10
    state = ShardState(tmp_path, "gpu-test", "k" * 64)
    lines: list[str] = []
    assert run_suite("gpu-test", _shards("slow"), state,
                     runner=lambda argv, env, log, limit: (None, limit),
                     echo=lines.append) == 1
    assert state.get("slow").status == "timed out"


def test_run_command_passes_the_shards_environment(tmp_path):
    log = tmp_path / "env.log"
    code, _ = run_command([sys.executable, "-c", "import os; print(os.environ['SHARD_X'])"],
                          {"SHARD_X": "seen"}, log, limit_s=60)
    assert code == 0 and log.read_text().strip() == "seen"


def test_the_closing_line_is_pytests_with_the_gates_tally():
    log = ("lines\n4 ok, 1 SLOWER, 5 gated on device busy, 1 host-checked (1 slower)\n"
           "PERF GATE FAILED\n======= 5 passed, 2 deselected in 81.20s (0:01:21) =======\n")
    assert closing_line(log) == ("5 passed, 2 deselected in 81.20s (0:01:21); gate: 4 ok, "
                                 "1 SLOWER, 5 gated on device busy, 1 host-checked (1 slower)")
    assert closing_line("Traceback\nValueError: bad\n") == "ValueError: bad"
    assert closing_line("") == ""


def test_the_code_key_follows_the_measured_code_only(tmp_path):
    for name in ("src/systems/a.py", "tests/test_a.py", "docs/a.md", "conftest.py",
                 "pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    key = code_key(tmp_path)
    (tmp_path / "docs/a.md").write_text("changed\n")
    (tmp_path / "src/systems/__pycache__").mkdir()
    (tmp_path / "src/systems/__pycache__/a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "src/lm_systems.egg-info").mkdir()
    (tmp_path / "src/lm_systems.egg-info/PKG-INFO").write_text("y\n")
    assert code_key(tmp_path) == key
    (tmp_path / "tests/correctness/docgen").mkdir(parents=True)  # CPU tests of tools/
    (tmp_path / "tests/correctness/docgen/test_doc.py").write_text("z = 1\n")
    assert code_key(tmp_path) == key
    (tmp_path / "src/systems/a.py").write_text("x = 2\n")
    assert code_key(tmp_path) != key


def test_each_baseline_runs_parts_are_combined_from_the_newest_studies(tmp_path):
    suite = gpu_baseline_shards(tmp_path)
    names = [shard.name for shard in suite]
    assert len(names) == len(set(names))
    parts = list(shards.BASELINE_PARTS_1GPU)
    assert names[:len(parts) + 1] == [*(f"run1_{p}" for p in parts), "combine_run1"]
    assert names.count("combine_run3") == 1 and names[-len(shards.INJECTED_RUNS):] == list(
        shards.INJECTED_RUNS)
    studies = tmp_path / "studies"
    studies.mkdir()
    for number, part in enumerate(parts, 1):
        (studies / f"{number:04d}_baseline_run1_{part}.json").write_text("{}")
    newer = studies / f"0099_baseline_run1_{parts[0]}.json"  # a part run again later
    newer.write_text("{}")
    combine = next(shard for shard in suite if shard.name == "combine_run1")
    argv = combine.argv()
    assert argv[1:4] == ["-m", "systems.runs.baseline", "combine"]
    assert str(newer) in argv and len(argv) == 4 + len(parts)
    repeat = next(shard for shard in suite if shard.name == "combine_run2")
    assert "--repeat" in repeat.argv() and "combine_run1" in repeat.needs
    injected = [shard for shard in suite if shard.name.startswith("injected_")]
    assert all(shard.expect == 1 and shard.env for shard in injected)
    assert all("--perf-gate" in shard.argv() for shard in injected)
    # each injected test function runs in its shard, and no function gets both slowdowns
    for shard in injected:
        device, host = (set(re.findall(r"(\w+):", shard.env[var])) for var in (
            "SYSTEMS_PERF_INJECT_DEVICE_WORK", "SYSTEMS_PERF_INJECT_SLOWDOWN"))
        assert device and host and not device & host
        files = " ".join(a for a in shard.argv() if a.startswith("tests/perf/"))
        assert all(_defines(files, name) for name in device | host), shard.name


def test_each_run_is_judged_against_the_others_pooled(tmp_path):
    suite = gpu_baseline_shards(tmp_path)
    held_out = [shard for shard in suite if shard.name.startswith("held_out_run")]
    assert [shard.name for shard in held_out] == [
        f"held_out_run{run}" for run in range(1, shards.BASELINE_RUNS + 1)]
    names = [shard.name for shard in suite]
    assert names.index("held_out_run1") > names.index(f"combine_run{shards.BASELINE_RUNS}")
    studies = tmp_path / "studies"
    studies.mkdir()
    parts = list(shards.BASELINE_PARTS_1GPU)
    files = {(run, part): studies / f"{10 * run + index:04d}_baseline_run{run}_{part}.json"
             for run in range(1, shards.BASELINE_RUNS + 1) for index, part in enumerate(parts)}
    for path in files.values():
        path.write_text("{}")
    argv = held_out[1].argv()
    assert argv[1:5] == ["-m", "systems.runs.baseline", "judge-held-out", "2"]
    assert argv[5:] == [",".join(str(files[run, part]) for part in parts)
                        for run in range(1, shards.BASELINE_RUNS + 1)]
    assert all(shard.expect == 0 and not shard.env and shard.needs == (
        f"combine_run{shards.BASELINE_RUNS}",) for shard in held_out)
