"""Where runs are kept under `.benchmarks/<GPU>/`, and which one a comparison uses.

    .benchmarks/<GPU>/baseline_<N>gpu.json   the complete quick-profile run on N GPUs of this
                                             model: what `--benchmark-compare` (no argument)
                                             and `--perf-gate` compare against
    .benchmarks/<GPU>/studies/NNNN_<name>.json  sweeps, tuning, subsets, the full profile
    .benchmarks/<GPU>/<machine-id>/NNNN_*.json  pytest-benchmark's own saves (--benchmark-save,
                                             --benchmark-autosave, as `make bench` does)

Neither a baseline nor a study matches pytest-benchmark's own storage glob
(`<machine-id>/NNNN_*.json`), so neither is picked up by its "newest file" rule; the compare
target is resolved here instead. The baseline is named by the GPU count because the
distributed cases depend on it.

    python -m systems.runs.baseline combine PART.json ...   (parts of one quick run -> baseline)
    python -m systems.runs.baseline part NAME [PYTEST ARGS]  (one part of the 1-GPU profile,
                                                              saved as a study to combine)
    python -m systems.runs.baseline suite                   (what `make baseline` runs here)
    python -m systems.runs.baseline judge RUN.json ...      (saved runs through the gate)
    python -m systems.runs.baseline judge-held-out K A1,A2 B1,B2 C1,C2
        (run K of these runs, each its parts, through the gate against the others pooled)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from systems.common.hardware import gpu_count, slugify
from systems.runs import keys
from systems.runs.combine import combine_read_runs, combine_runs, reserve_run_path
from systems.runs.gate import Timing, compare, gate_table, host_speed_line, regressions
from systems.runs.history import read_run
from systems.runs.validate import check_same_gpu, gpu_model

STUDIES = "studies"
RECORD_COMMAND = "make baseline"  # pytest tests/perf --perf-profile=quick --perf-baseline,
# then --perf-baseline-repeat for each further run (BASELINE_RUNS in the Makefile)


class JsonDestination(os.PathLike):
    """A path given to pytest-benchmark as `--benchmark-json`, which releases disagree on:
    5.3 opens the path it is given, 5.2 takes an open file (argparse.FileType) and writes
    inside `with`. This is a path to the first and opens itself for the second."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: BinaryIO | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __enter__(self) -> BinaryIO:
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed in __exit__)
        return self._file

    def __exit__(self, *exc_info: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def json_destination_path(option: object) -> Path:
    """The path of a `--benchmark-json` value: a path (pytest-benchmark 5.3 gives a Path,
    whose `.name` is only its last part), or an open file (5.2: argparse.FileType)."""
    if isinstance(option, str | os.PathLike):
        return Path(option)
    return Path(option.name)


def baseline_suite(gpus: int) -> str:
    """What a baseline on a host with `gpus` GPUs covers: the distributed suite where there
    are GPUs to spread over, the single-GPU suites elsewhere (one GPU kind gates each)."""
    return "tests/perf/test_distributed.py" if gpus >= 2 else "tests/perf"


# The single-GPU quick profile in parts, for hosts whose jobs have a time limit the whole
# profile does not fit (cold compiles take most of the training part): each part's pytest
# arguments. Together they select every case of the profile once
# (tests/correctness/runs/test_perf_baseline.py); on one H100 each part of a cold run takes
# a few minutes.
BASELINE_PARTS_1GPU: dict[str, tuple[str, ...]] = {
    "attention": ("tests/perf/test_attention.py",),
    "training": ("tests/perf/test_end_to_end.py", "tests/perf/test_distributed.py",
                 "tests/perf/test_training_recipes.py"),
}


def run_part(part: str, extra: list[str]) -> int:
    """Run one part of the single-GPU quick profile as the study `baseline_part_<part>`."""
    if part not in BASELINE_PARTS_1GPU:
        raise ValueError(f"unknown part {part!r}; choose one of {sorted(BASELINE_PARTS_1GPU)}")
    command = [sys.executable, "-m", "pytest", *BASELINE_PARTS_1GPU[part],
               "-p", "no:cacheprovider", "--perf-profile=quick",
               f"--perf-study=baseline_part_{part}", *extra]
    print(" ".join(command), flush=True)
    return subprocess.run(command, check=False).returncode


def baseline_path(storage: Path, gpus: int) -> Path:
    return storage / f"baseline_{gpus}gpu.json"


def gating_baselines(storage: Path, gpus: int) -> list[Path]:
    """The baselines that gate a run on `gpus` GPUs of one model, whether or not they exist
    yet: that count's and, on several GPUs, the one-GPU baseline too, which holds the
    single-GPU suites (their cases run on one GPU whatever the host has)."""
    return [baseline_path(storage, count) for count in ((gpus, 1) if gpus >= 2 else (gpus,))]


@dataclass(frozen=True)
class GateSource:
    """A saved run the gate compares with: its path, commit and host speed probes."""

    path: Path
    commit: str
    host_loop_ms: tuple[float, ...]


def gate_baseline(runs: list[tuple[Path, dict]]) -> tuple[dict[str, Timing], list[GateSource]]:
    """The cases of these saved runs (read and validated) by full name, a case that several
    hold taken from the first, and what each run is."""
    timings: dict[str, Timing] = {}
    sources = []
    for path, run in runs:
        try:
            timings = run_timings(run) | timings  # a case taken already keeps its run's
            probes = tuple(host_loop_ms_runs(run))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        sources.append(GateSource(path, str(run["commit_info"]["id"]), probes))
    return timings, sources


def describe_sources(sources: list[GateSource]) -> str:
    return ", ".join(f"{source.path} (commit {source.commit})" for source in sources)


def host_speed_lines(this_run_ms: float | None, sources: list[GateSource]) -> list[str]:
    """`host_speed_line` against each source that has probes (named when there are several)."""
    lines = [(source, host_speed_line(this_run_ms, list(source.host_loop_ms)))
             for source in sources]
    return [line if len(sources) == 1 else f"{source.path.name}: {line}"
            for source, line in lines if line is not None]


def study_path(storage: Path, name: str) -> Path:
    """The next free `studies/NNNN_<name>.json` of this GPU's storage, reserved (created
    empty) so that a concurrent session with the same name takes the number after it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"study name {name!r}: use letters, digits, '_', '-' and '.' only")
    return reserve_run_path(storage / STUDIES, name)


def case_names(run: dict) -> set[str]:
    """Full names (node ids) of the benchmarks a saved run holds."""
    return {bench["fullname"] for bench in run["benchmarks"]}


def missing_cases(expected: Iterable[str], run: dict) -> list[str]:
    """Expected node ids that the saved run has no result for, in the order given."""
    present = case_names(run)
    return [name for name in expected if name not in present]


def baseline_problems(path: Path, expected: Iterable[str]) -> list[str]:
    """Why the baseline at `path` cannot gate the `expected` cases (node ids); [] if it can."""
    redo = (f"record it again on that GPU with `{RECORD_COMMAND}` (or combine parts with "
            "`python -m systems.runs.baseline combine`) and commit it")
    if not path.is_file():
        return [f"no baseline at {path}: {redo}"]
    missing = missing_cases(expected, json.loads(path.read_text()))
    if not missing:
        return []
    return [f"{len(missing)} case(s) have no result in {path}: {redo}",
            *(f"  {name}" for name in missing)]


def run_timings(run: dict) -> dict[str, Timing]:
    """Every benchmark's clocks in a saved run (`read_run`), with the run's host speed
    probes, by full name."""
    probes = host_loop_ms_runs(run)
    return {bench.get("fullname", bench["name"]):
            Timing.from_saved(bench["stats"], bench.get("extra_info"), probes)
            for bench in run["benchmarks"]}


def host_loop_ms(run: dict) -> float | None:
    """The host speed probe a saved run recorded (`machine_info`), ms; None for runs saved
    without it."""
    value = (run.get("machine_info") or {}).get(keys.HOST_PYTHON_LOOP_MS)
    if value is None:
        return None
    return _probe_ms(keys.HOST_PYTHON_LOOP_MS, value)


def host_loop_ms_runs(run: dict) -> list[float]:
    """The host speed probe of each run a saved (possibly pooled) run holds, ms; [] for
    runs saved without it."""
    values = (run.get("machine_info") or {}).get(keys.HOST_PYTHON_LOOP_MS_RUNS)
    if values is None:
        single = host_loop_ms(run)
        return [] if single is None else [single]
    if not isinstance(values, list):
        raise ValueError(f"machine_info.{keys.HOST_PYTHON_LOOP_MS_RUNS} is {values!r}, "
                         "not a list")
    return [_probe_ms(keys.HOST_PYTHON_LOOP_MS_RUNS, v) for v in values]


def _probe_ms(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"machine_info.{key}: {value!r} is not a positive number of ms")
    return float(value)


def add_repeat(baseline: dict, repeat: dict) -> dict:
    """`baseline` with `repeat`, another complete run of the same commit on the same GPU
    model, pooled in: each case's rounds together (its stats recomputed over all of them)
    and each run's median kept in `extra_info["run_medians"]`, which the gate reads as the
    case's drift between runs. A case that recorded do_bench in every run keeps each run's
    do_bench median, and its median and mean become those over the runs (`_pooled_do_bench`).
    The host speed probe of each run is kept in
    `machine_info["host_python_loop_ms_runs"]` while every pooled run recorded one (a run
    without it drops the probe from the pooled file, which then says nothing rather than
    something about only some of its runs). Raises ValueError when the runs do not belong
    together."""
    # pytest-benchmark's own statistics, so pooled stats mean what a single run's do; it is
    # a test requirement, so it is imported only where repeats are pooled (during a run).
    from pytest_benchmark.stats import Stats
    for key, what in (("commit_info", "id"), ("machine_info", "device_name"),
                      ("machine_info", "gpu_count")):
        if baseline[key].get(what) != repeat[key].get(what):
            raise ValueError(f"a repeat must match the baseline's {key}.{what}: "
                             f"{repeat[key].get(what)!r} is not {baseline[key].get(what)!r}")
    repeats = {bench["fullname"]: bench for bench in repeat["benchmarks"]}
    if set(repeats) != case_names(baseline):
        raise ValueError("a repeat must hold exactly the baseline's cases; differing: "
                         f"{sorted(set(repeats) ^ case_names(baseline))}")
    pooled = []
    for bench in baseline["benchmarks"]:
        other = repeats[bench["fullname"]]
        data = [*bench["stats"]["data"], *other["stats"]["data"]]
        stats = Stats()
        for value in data:
            stats.update(value)
        run_medians = bench["extra_info"].get(keys.RUN_MEDIANS) or [bench["stats"]["median"]]
        pooled.append({
            **bench,
            "stats": {**stats.as_dict(), "data": data,
                      "iterations": bench["stats"].get("iterations", 1)},
            "extra_info": {**_pooled_clock_rounds(_pooled_device_rounds(
                               _pooled_do_bench(bench["extra_info"], other["extra_info"]),
                               other["extra_info"]), other["extra_info"]),
                           keys.RUN_MEDIANS: [*run_medians, other["stats"]["median"]]},
        })
    return {**baseline, "machine_info": _pooled_host_probe(baseline, repeat),
            "benchmarks": pooled}


def _pooled_do_bench(pooled: dict, repeat: dict) -> dict:
    """A case's extra_info with the repeat's do_bench reading pooled in: each run's median
    kept, the median of those as the case's, the mean of the runs' means, the larger IQR
    (the noisier run's). Where either side lacks a reading, the pooled case has none: a
    reading of only some runs is not the pooled case's."""
    names = (keys.DO_BENCH_MEDIAN_MS, keys.DO_BENCH_MEAN_MS, keys.DO_BENCH_RUN_MEDIANS_MS,
             keys.DO_BENCH_IQR_MS)
    info = {name: value for name, value in pooled.items() if name not in names}
    if keys.DO_BENCH_MEDIAN_MS not in pooled or keys.DO_BENCH_MEDIAN_MS not in repeat:
        return info
    medians = [*(pooled.get(keys.DO_BENCH_RUN_MEDIANS_MS) or [pooled[keys.DO_BENCH_MEDIAN_MS]]),
               repeat[keys.DO_BENCH_MEDIAN_MS]]
    # The pooled mean weighs runs alike: every run's do_bench took about the same time.
    runs_before = len(medians) - 1
    mean = (pooled[keys.DO_BENCH_MEAN_MS] * runs_before + repeat[keys.DO_BENCH_MEAN_MS]) / (
        runs_before + 1)
    if keys.DO_BENCH_IQR_MS in pooled and keys.DO_BENCH_IQR_MS in repeat:
        info[keys.DO_BENCH_IQR_MS] = max(pooled[keys.DO_BENCH_IQR_MS], repeat[keys.DO_BENCH_IQR_MS])
    return {**info, keys.DO_BENCH_RUN_MEDIANS_MS: medians,
            keys.DO_BENCH_MEDIAN_MS: statistics.median(medians), keys.DO_BENCH_MEAN_MS: mean}


def _pooled_device_rounds(pooled: dict, repeat: dict) -> dict:
    """A case's extra_info with the repeat's rounds taken in turn
    (`keys.INTERLEAVED_DEVICE_MS`) after its own, where both runs took them with the same
    implementations; else without any (rounds of only some runs are not the pooled case's)."""
    info = {name: value for name, value in pooled.items() if name != keys.INTERLEAVED_DEVICE_MS}
    ours, theirs = pooled.get(keys.INTERLEAVED_DEVICE_MS), repeat.get(keys.INTERLEAVED_DEVICE_MS)
    if not isinstance(ours, dict) or not isinstance(theirs, dict) or set(ours) != set(theirs):
        return info
    return {**info, keys.INTERLEAVED_DEVICE_MS: {impl: [*ours[impl], *theirs[impl]]
                                                 for impl in ours}}


# Per-round readings beside a case's rounds, and the key of each run's median of them.
_CLOCK_ROUNDS = {keys.DEVICE_KERNEL_S: keys.DEVICE_KERNEL_RUN_MEDIANS,
                 keys.HOST_ENQUEUE_ROUNDS_S: keys.HOST_ENQUEUE_RUN_MEDIANS}


def _pooled_clock_rounds(pooled: dict, repeat: dict) -> dict:
    """A case's extra_info with the repeat's device-clock and host rounds after its own and
    each run's median kept, where both runs recorded them; else without them (readings of
    only some runs are not the pooled case's)."""
    info = dict(pooled)
    for rounds_key, medians_key in _CLOCK_ROUNDS.items():
        ours, theirs = info.pop(rounds_key, None), repeat.get(rounds_key)
        medians = info.pop(medians_key, None) or ([statistics.median(ours)] if ours else [])
        if ours and theirs:
            info.update({rounds_key: [*ours, *theirs],
                         medians_key: [*medians, statistics.median(theirs)]})
    return info


def _pooled_host_probe(baseline: dict, repeat: dict) -> dict:
    """The baseline's machine_info with the repeat's host speed probe added to its runs'."""
    probes, added = host_loop_ms_runs(baseline), host_loop_ms(repeat)
    info = _without_host_probe(baseline["machine_info"])
    if probes and added is not None:
        info.update({keys.HOST_PYTHON_LOOP_MS: probes[0],
                     keys.HOST_PYTHON_LOOP_MS_RUNS: [*probes, added]})
    return info


def _without_host_probe(machine_info: dict) -> dict:
    return {key: value for key, value in machine_info.items()
            if key not in (keys.HOST_PYTHON_LOOP_MS, keys.HOST_PYTHON_LOOP_MS_RUNS)}


def storage_of(run: dict, benchmarks_root: Path) -> Path:
    """`.benchmarks/<GPU>` of the machine a saved run was made on."""
    return benchmarks_root / slugify(str(run["machine_info"]["device_name"]))


def combine_into_baseline(parts: list[Path], benchmarks_root: Path, *,
                          repeat: bool = False) -> Path:
    """Union of separately run parts of one quick-profile run, written as their GPU's
    baseline, or with `repeat` pooled into that baseline as one more run (`add_repeat`).
    The parts must be runs of one commit and agree on the GPU count."""
    runs = [(path, read_run(path)) for path in parts]
    commits = {str((run.get("commit_info") or {}).get("id")) for _, run in runs}
    if len(commits) != 1 or "None" in commits:
        raise ValueError(f"parts must be runs of one recorded commit, got {sorted(commits)}")
    counts = {(run.get("machine_info") or {}).get("gpu_count") for _, run in runs}
    if len(counts) != 1 or None in counts:
        raise ValueError(f"parts disagree on (or lack) machine_info.gpu_count: {counts}")
    combined = combine_read_runs(runs)
    # Each part ran in a session of its own, on a host of its own speed: no one part's host
    # speed probe describes the whole, so the baseline records none.
    combined["machine_info"] = _without_host_probe(combined.get("machine_info") or {})
    target = baseline_path(storage_of(combined, benchmarks_root), counts.pop())
    if repeat:
        if not target.is_file():
            raise ValueError(f"a repeat is pooled into the baseline at {target}, which does "
                             "not exist: combine the first run's parts without --repeat")
        baseline = json.loads(target.read_text())
        combined = {**add_repeat(baseline, combined),
                    "combined_from": [*baseline.get("combined_from", []),
                                      *combined["combined_from"]]}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(combined, indent=4))
    return target


def judge_runs(runs: list[Path], against: Path | None, benchmarks_root: Path,
               shown_from: Path | None = None) -> int:
    """Print the gate's table for each saved run (its files named relative to `shown_from`
    if set): 0 when none regressed, 1 when one did (a regression), 2 when an input is
    unusable (a file the validator refuses, runs of another GPU model, or a run with no
    case in its baseline): then nothing is judged."""
    try:
        judged = [_judged(path, against, benchmarks_root) for path in runs]
    except ValueError as error:  # MalformedRunError is one
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = False
    for path, run, baselines in judged:
        timings, sources = gate_baseline(baselines)
        results = compare(timings, run_timings(run))
        if shown_from:
            path = path.relative_to(shown_from)
            sources = [replace(s, path=s.path.relative_to(shown_from)) for s in sources]
        print(f"- perf gate: {path} vs {describe_sources(sources)} -")
        for line in host_speed_lines(host_loop_ms(run), sources):
            print(line)
        print(gate_table(results))
        failed = failed or bool(regressions(results))
    return 1 if failed else 0


def judge_held_out(held_out: int, runs: list[list[Path]]) -> int:
    """Run `held_out` (1-based) of `runs` (each the part files of one complete quick run)
    through the gate against the other runs pooled into a baseline, as a new run is judged
    against a recorded one: an unchanged run that raises an alarm there is a false alarm.
    `judge_runs`'s exit codes."""
    if not 1 <= held_out <= len(runs) or len(runs) < 2:
        raise ValueError(f"hold out one of at least two runs, not run {held_out} of {len(runs)}")
    with tempfile.TemporaryDirectory() as folder:
        pooled = [index for index in range(1, len(runs) + 1) if index != held_out]
        # The gate table names the files relative to `folder`: what was judged against what.
        root = Path(folder) / f"runs_{'_'.join(map(str, pooled))}_pooled"
        baseline = combine_into_baseline(runs[pooled[0] - 1], root)
        for index in pooled[1:]:
            combine_into_baseline(runs[index - 1], root, repeat=True)
        current = Path(folder) / f"held_out_run{held_out}.json"
        current.write_text(json.dumps(combine_runs(runs[held_out - 1])))
        return judge_runs([current], baseline, root, shown_from=Path(folder))


def _judged(path: Path, against: Path | None,
            benchmarks_root: Path) -> tuple[Path, dict, list[tuple[Path, dict]]]:
    """(run's path, run, [(baseline's path, baseline)]): `against`, else the baselines that
    gate the run's GPU count (`gating_baselines`, those that exist), all validated, of one
    GPU model and with at least one case in common; ValueError otherwise."""
    run = read_run(path)
    targets = [against] if against else gating_baselines(
        storage_of(run, benchmarks_root), int(run["machine_info"].get("gpu_count") or 0))
    targets = [target for target in targets if target.is_file()] or targets[:1]
    baselines = [(target, read_run(target)) for target in targets]
    for target, baseline in baselines:
        check_same_gpu(baseline, gpu_model(run), str(target))
    if not case_names(run) & set().union(*(case_names(b) for _, b in baselines)):
        raise ValueError(f"{path} has no case in common with "
                         f"{', '.join(map(str, targets))}: nothing to judge")
    return path, run, baselines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m systems.runs.baseline",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    combine = commands.add_parser("combine", help="parts of one quick run -> the baseline")
    combine.add_argument("parts", nargs="+", type=Path, help="saved run JSON files")
    combine.add_argument("--root", type=Path, default=Path(".benchmarks"))
    combine.add_argument("--repeat", action="store_true",
                         help="pool the parts, as one more run of the baseline's commit, into "
                              "the existing baseline (as --perf-baseline-repeat does)")
    commands.add_parser("suite", help="the perf tests a baseline on this host covers")
    part = commands.add_parser(
        "part", help="one part of the single-GPU quick profile, saved as a study; combine the "
                     "studies of every part (`combine`, `combine --repeat`)")
    part.add_argument("name", choices=sorted(BASELINE_PARTS_1GPU))
    part.add_argument("pytest_args", nargs=argparse.REMAINDER,
                      help="passed on to pytest (e.g. --benchmark-columns=median,iqr)")
    judge = commands.add_parser(
        "judge", help="saved runs through the gate, against their GPU's baseline",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    judge.add_argument("runs", nargs="+", type=Path, help="saved run JSON files")
    judge.add_argument("--against", type=Path, default=None,
                       help="the run to compare with (default: the runs' GPU's baseline)")
    judge.add_argument("--root", type=Path, default=Path(".benchmarks"))
    held_out = commands.add_parser(
        "judge-held-out", help="one complete run through the gate against the others pooled")
    held_out.add_argument("held_out", type=int, help="which run to hold out (1-based)")
    held_out.add_argument("runs", nargs="+", type=lambda text: [Path(p) for p in text.split(",")],
                          help="each run's part files, comma-separated")
    args = parser.parse_args(argv)
    if args.command == "suite":
        print(baseline_suite(gpu_count()))
        return 0
    if args.command == "judge":
        return judge_runs(args.runs, args.against, args.root)
    if args.command == "judge-held-out":
        try:
            return judge_held_out(args.held_out, args.runs)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    if args.command == "part":
        return run_part(args.name, args.pytest_args)
    try:
        target = combine_into_baseline(args.parts, args.root, repeat=args.repeat)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {target}; check it is complete with "
          "`pytest tests/correctness/runs/test_perf_baseline.py`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
