"""The GPU suite and the one-GPU baseline as shards: commands of at most `SHARD_LIMIT_S` each
on one H100, run in order by one command, resumable.

    python -m systems.runs.shards gpu-test       every GPU-marked correctness and distributed test
    python -m systems.runs.shards gpu-baseline   the one-GPU baseline (BASELINE_RUNS runs of the
                                                 quick profile, each in parts, pooled), then the
                                                 gate's demonstrations against it
    python -m systems.runs.shards SUITE --list   the shards and what each runs

A shard's outcome is recorded under `--state` (default `.benchmarks/<GPU>/shards/`, where the
records are committed beside the runs they made, and the logs are not), keyed by the content
of the measured code (src/, tests/, conftest.py, pyproject.toml): run the same command
again, in this checkout or in another at the same code, and only the shards not yet passed
there run. `--deadline-s` stops
before a shard that would not finish in time (exit 3: run the command again to go on), so
one command fits a job's time limit. Each shard prints one progress line; the end prints
every shard's outcome and the GPU-minutes spent on this code, this command's and in all.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from systems.common.hardware import device_slug
from systems.runs.baseline import BASELINE_PARTS_1GPU

SHARD_LIMIT_S = 8 * 60  # a shard that runs longer is stopped and recorded as timed out
INCOMPLETE = 3  # exit code: shards are left for the next run of the same command
MEASURED_CODE = ("src", "tests", "conftest.py", "pyproject.toml")
BASELINE_RUNS = 3  # complete runs pooled into the baseline (as `make baseline` pools)
# The injected run, gated against the new baseline: per shard its cases, 8% more GPU work
# in the rounds of some test functions and 30% more host time in others' (their device clock
# must not move), and its expected H100 minutes. Every clock the gate reads is covered; the
# training slice keeps to the small model, so the demonstration costs a minute or two.
INJECTED_RUNS: dict[str, tuple[tuple[str, ...], str, str, float]] = {
    "injected_attention": (
        BASELINE_PARTS_1GPU["attention"],
        "test_attention_table:0.08,test_attention_leaderboard:0.08,"
        "test_attention_device_time:0.08", "test_attention:0.3", 1.5),
    "injected_training": (
        ("tests/perf/test_training_recipes.py", "tests/perf/test_end_to_end.py", "-k", "small"),
        "test_training_recipe:0.08", "test_end_to_end:0.3", 1),
}
# The gate's columns, and each part's slowest cases (what the next plan of shards sizes on).
PERF_ARGS = ("--benchmark-columns=median,iqr,mean,stddev,rounds", "--durations=15")


@dataclass(frozen=True)
class Shard:
    """One command of a suite. `argv` is built when the shard starts (a combine step names
    the files the shards before it wrote); `expect` is the exit code that counts as passed
    (an injected slowdown must fail the gate); `minutes` is its expected cost on one H100,
    which `--deadline-s` plans with; `needs` are shards that must have passed first."""

    name: str
    argv: Callable[[], list[str]]
    minutes: float
    expect: int = 0
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()


def _python(*args: str) -> Callable[[], list[str]]:
    return lambda: [sys.executable, *args]


def _pytest(*args: str) -> Callable[[], list[str]]:
    return _python("-m", "pytest", "-p", "no:cacheprovider", *args)


# GPU-marked tests by where their time goes; `tests/correctness/runs/test_shards.py` checks
# that these select every GPU-marked test once.
GPU_TEST_SHARDS: dict[str, tuple[tuple[str, ...], float]] = {
    "attention_gluon": (("tests/correctness/attention/test_flash_attention_gluon.py",), 2.5),
    "attention_replay": (("tests/correctness/attention/test_attention_replay.py",), 1),
    "attention_triton": (("tests/correctness/attention",
                          "--ignore=tests/correctness/attention/test_flash_attention_gluon.py",
                          "--ignore=tests/correctness/attention/test_attention_replay.py"), 1.5),
    "training_and_harness": (("tests/correctness", "tests/distributed",
                              "--ignore=tests/correctness/attention"), 3.5),
}
GPU_TEST_ARGS = ("-m", "gpu", "-n", "4", "--timeout=600", "-q", "-rfEs", "--durations=10")


def gpu_test_shards() -> list[Shard]:
    return [Shard(name, _pytest(*paths, *GPU_TEST_ARGS), minutes)
            for name, (paths, minutes) in GPU_TEST_SHARDS.items()]


# Expected H100 minutes of each part of the quick profile: the first run compiles every
# model (Inductor's cache then holds them), later runs mostly measure.
PART_MINUTES = {"attention": (3, 2), "training": (5.5, 2)}


def newest_study(storage: Path, name: str) -> list[str]:
    """The newest saved study called `name` in `storage` (a list of none or one): the run a
    shard that passed wrote, whatever earlier recordings left under that name."""
    found = sorted((storage / "studies").glob(f"[0-9][0-9][0-9][0-9]_{name}.json"))
    return [str(found[-1])] if found else []


def gpu_baseline_shards(storage: Path) -> list[Shard]:
    """Every part of `BASELINE_RUNS` runs (a study each), each run's parts combined into the
    baseline (the first) or pooled into it (the others); then each run judged against the
    others pooled (on the CPU), and one gated run with slowdowns injected, each part saved
    as a study too."""

    def parts_of(run: int) -> Callable[[], list[str]]:
        return lambda: [path for part in BASELINE_PARTS_1GPU
                        for path in newest_study(storage, f"baseline_run{run}_{part}")]

    shards: list[Shard] = []
    for run in range(1, BASELINE_RUNS + 1):
        names = []
        for part, args in BASELINE_PARTS_1GPU.items():
            name = f"run{run}_{part}"
            shards.append(Shard(name, _pytest(*args, "--perf-profile=quick", *PERF_ARGS,
                                              f"--perf-study=baseline_{name}"),
                                PART_MINUTES[part][0 if run == 1 else 1]))
            names.append(name)

        parts = parts_of(run)
        repeat = ("--repeat",) if run > 1 else ()
        needs = (*names, *((f"combine_run{run - 1}",) if run > 1 else ()))
        shards.append(Shard(f"combine_run{run}",
                            lambda parts=parts, repeat=repeat: [
                                sys.executable, "-m", "systems.runs.baseline", "combine",
                                *repeat, *parts()],
                            0.1, needs=needs))
    runs = [parts_of(run) for run in range(1, BASELINE_RUNS + 1)]
    # Each unchanged run against the others pooled: BASELINE_RUNS re-runs for no GPU time.
    for run in range(1, BASELINE_RUNS + 1):
        shards.append(Shard(f"held_out_run{run}",
                            lambda run=run: [sys.executable, "-m", "systems.runs.baseline",
                                             "judge-held-out", str(run),
                                             *(",".join(parts()) for parts in runs)],
                            0.1, needs=(f"combine_run{BASELINE_RUNS}",)))
    gated = ("--perf-profile=quick", "--benchmark-compare", "--perf-gate", *PERF_ARGS)
    for name, (args, device_work, host_time, minutes) in INJECTED_RUNS.items():
        shards.append(Shard(name, _pytest(*args, *gated, f"--perf-study=gate_{name}"),
                            minutes, expect=1, needs=(f"combine_run{BASELINE_RUNS}",),
                            env={"SYSTEMS_PERF_INJECT_DEVICE_WORK": device_work,
                                 "SYSTEMS_PERF_INJECT_SLOWDOWN": host_time}))
    return shards


_NOT_CODE = ("__pycache__", ".pytest_cache", ".hypothesis")  # caches a run leaves behind
# Tests of the doc tools (tools/, which is not measured code either) run on the CPU only.
_NOT_MEASURED = ("tests/correctness/docgen",)


def code_key(repo: Path, paths: Iterable[str] = MEASURED_CODE) -> str:
    """A hash of the measured code's files (their paths and bytes; caches left out): the
    same at any commit that changed only docs, runs or tools."""
    digest = hashlib.sha256()
    for top in paths:
        root = repo / top
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix not in (".pyc", ".so")
            and not any(part in _NOT_CODE or part.endswith(".egg-info") for part in p.parts)
            and not any(p.relative_to(repo).as_posix().startswith(f"{skip}/")
                        for skip in _NOT_MEASURED))
        for path in files:
            digest.update(str(path.relative_to(repo)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass
class Record:
    """What one shard's last run at this code did."""

    shard: str
    status: str  # "passed", "failed" (exit code not the expected one), "timed out", "skipped"
    seconds: float
    exit_code: int | None
    summary: str  # pytest's closing line, or the command's last line
    spent_s: float = 0.0  # every attempt at this code, this one included

    @classmethod
    def read(cls, path: Path) -> Record | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


class ShardState:
    """Records and logs of one suite at one code key: `<state>/<suite>/<key[:16]>/`."""

    def __init__(self, state: Path, suite: str, key: str) -> None:
        self.folder = state / suite / key[:16]
        self.folder.mkdir(parents=True, exist_ok=True)

    def record_path(self, shard: str) -> Path:
        # Not .json: the reports read every JSON under .benchmarks/<GPU>/ as a saved run.
        return self.folder / f"{shard}.record"

    def log_path(self, shard: str) -> Path:
        return self.folder / f"{shard}.log"

    def get(self, shard: str) -> Record | None:
        return Record.read(self.record_path(shard))

    def put(self, record: Record) -> None:
        self.record_path(record.shard).write_text(json.dumps(record.__dict__, indent=1))


_PYTEST_CLOSING = re.compile(r"^=+ (.* in [0-9.]+s.*) =+$")
_GATE_TALLY = re.compile(r"^\d+ (ok|SLOWER|faster|not gated|not run|new).*gated on ")


def closing_line(log: str) -> str:
    """pytest's closing summary ("3 passed, 1 skipped in 4.2s"), else the last line; with
    the perf gate's tally after it where the log has one."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    closing = next((match.group(1) for line in reversed(lines)
                    if (match := _PYTEST_CLOSING.match(line))), lines[-1] if lines else "")
    tally = next((line for line in reversed(lines) if _GATE_TALLY.match(line)), None)
    return closing if tally is None else f"{closing}; gate: {tally}"


def run_command(argv: Sequence[str], env: dict[str, str], log: Path,
                limit_s: float) -> tuple[int | None, float]:
    """Run `argv` with its output to `log`; stop its whole process group after `limit_s`.
    (exit code or None when stopped, seconds)."""
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **env}, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    return code, time.monotonic() - start


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} GPU-min"


def run_suite(suite: str, shards: list[Shard], state: ShardState, *,
              deadline_s: float | None = None, limit_s: float = SHARD_LIMIT_S,
              runner: Callable[..., tuple[int | None, float]] = run_command,
              clock: Callable[[], float] = time.monotonic,
              echo: Callable[[str], None] = print) -> int:
    """Each shard not yet passed at this code, in order: 0 when all have passed, 1 when one
    failed, `INCOMPLETE` when the deadline left some unrun."""
    start = clock()
    spent_now = 0.0
    left: list[str] = []
    for index, shard in enumerate(shards, 1):
        tag = f"[{suite} {index}/{len(shards)}] {shard.name}"
        done = state.get(shard.name)
        if done is not None and done.status == "passed":
            echo(f"{tag}: passed earlier at this code ({done.seconds:.0f} s): {done.summary}")
            continue
        unmet = [name for name in shard.needs
                 if (state.get(name) or Record(name, "", 0, None, "")).status != "passed"]
        if unmet:
            echo(f"{tag}: not run: needs {', '.join(unmet)} to pass first")
            left.append(shard.name)
            continue
        elapsed = clock() - start
        if deadline_s is not None and elapsed + 60 * shard.minutes > deadline_s:
            echo(f"{tag}: not started: expected {shard.minutes:g} min, "
                 f"{max(0, deadline_s - elapsed) / 60:.1f} min left before the deadline")
            left.append(shard.name)
            continue
        log = state.log_path(shard.name)
        code, seconds = runner(shard.argv(), shard.env, log, limit_s)
        spent_now += seconds
        summary = closing_line(log.read_text(errors="replace")) if log.exists() else ""
        status = ("timed out" if code is None else
                  "passed" if code == shard.expect else "failed")
        spent_before = done.spent_s if done is not None else 0.0
        state.put(Record(shard.name, status, round(seconds, 1), code, summary,
                         round(spent_before + seconds, 1)))
        expected = f", expected exit {shard.expect}" if shard.expect else ""
        echo(f"{tag}: {status} in {seconds:.0f} s (exit {code}{expected}): {summary}; "
             f"{minutes(spent_now)} this run")
        if status != "passed":
            echo(f"    log: {log}")
    return _summarise(suite, shards, state, spent_now, left, echo)


def _summarise(suite: str, shards: list[Shard], state: ShardState, spent_now: float,
               left: list[str], echo: Callable[[str], None]) -> int:
    records = {shard.name: state.get(shard.name) for shard in shards}
    total = sum(record.spent_s for record in records.values() if record is not None)
    failed = [name for name, record in records.items()
              if record is not None and record.status in ("failed", "timed out")]
    passed = sum(1 for record in records.values() if record and record.status == "passed")
    echo(f"{suite}: {passed}/{len(shards)} shards passed at this code; "
         f"{minutes(spent_now)} this run, {minutes(total)} in all "
         f"(records in {state.folder})")
    if failed:
        echo(f"{suite}: failed: {', '.join(failed)}")
        return 1
    if left or passed < len(shards):
        echo(f"{suite}: {len(shards) - passed} shard(s) left: run the same command again")
        return INCOMPLETE
    return 0


SUITES = ("gpu-test", "gpu-baseline")


def suite_shards(suite: str, repo: Path) -> list[Shard]:
    if suite == "gpu-test":
        return gpu_test_shards()
    if suite == "gpu-baseline":
        return gpu_baseline_shards(repo / ".benchmarks" / device_slug())
    raise ValueError(f"unknown suite {suite!r}; choose one of {SUITES}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m systems.runs.shards",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--state", type=Path, default=None,
                        help="where shards' outcomes and logs are kept "
                             "(default: .benchmarks/<GPU>/shards)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no shard expected to end later than this many seconds "
                             "after the command began")
    parser.add_argument("--list", action="store_true", help="print the shards and exit")
    args = parser.parse_args(argv)
    repo = Path.cwd()
    key = code_key(repo)
    state = args.state or repo / ".benchmarks" / device_slug() / "shards"
    shards = suite_shards(args.suite, repo)
    if args.list:
        for shard in shards:
            print(f"{shard.name} ({shard.minutes:g} min): {' '.join(shard.argv())}")
        return 0
    print(f"{args.suite}: {len(shards)} shards, code {key[:16]}", flush=True)
    return run_suite(args.suite, shards, ShardState(state, args.suite, key),
                     deadline_s=args.deadline_s,
                     echo=lambda line: print(line, flush=True))


if __name__ == "__main__":
    raise SystemExit(main())
