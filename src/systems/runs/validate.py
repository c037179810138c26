"""The one check of a saved run that every reader of runs goes through: the gate, `baseline
judge`, `report compare` and every report.

A run passes when it has the shape pytest-benchmark writes and every number a reader
divides by or compares is usable: each benchmark has a name, a full name and finite stats
with a positive median and mean, a non-negative IQR and at least one round; the lists a
pooled baseline or the device clock add (`keys.RUN_MEDIANS`, `keys.DEVICE_KERNEL_S`, ...)
hold finite positive numbers; and the run names the GPU model it ran on and its commit.
One bad number (a NaN median reads as "too noisy", a NaN IQR as "ok", a zero median
divides by zero at the end of a suite) refuses the whole file, naming it and the value.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from systems.runs import keys


class MalformedRunError(ValueError):
    """A saved run that no reader may trust; the message names the file and why."""


# Per-round or per-run lists a case's extra_info may hold: each value a positive seconds
# (or ms) count.
_POSITIVE_LISTS = (keys.RUN_MEDIANS, keys.DEVICE_KERNEL_S, keys.DEVICE_KERNEL_RUN_MEDIANS,
                   keys.HOST_ENQUEUE_ROUNDS_S, keys.HOST_ENQUEUE_RUN_MEDIANS)


def _positive(value: object, *, zero_ok: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (value >= 0 if zero_ok else value > 0)


def benchmark_problems(bench: object, index: int) -> list[str]:
    """Why one entry of a run's `benchmarks` cannot be read; [] when it can."""
    if not isinstance(bench, dict) or not isinstance(bench.get("name"), str):
        return [f"benchmark {index} has no name"]
    name = bench["name"]
    if not isinstance(bench.get("fullname"), str):
        return [f"{name} has no fullname"]
    stats = bench.get("stats")
    if not isinstance(stats, dict):
        return [f"{name} has no stats"]
    problems = [f"{name}: stats.{key} is {stats.get(key)!r}, not a finite positive number"
                for key in ("median", "mean") if not _positive(stats.get(key))]
    if not _positive(stats.get("iqr"), zero_ok=True):
        problems.append(f"{name}: stats.iqr is {stats.get('iqr')!r}, not a finite number >= 0")
    rounds = stats.get("rounds")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        problems.append(f"{name}: stats.rounds is {rounds!r}, not a count of at least 1")
    info = bench.get("extra_info") or {}
    if not isinstance(info, dict):
        return [*problems, f"{name}'s extra_info is not an object"]
    for key in _POSITIVE_LISTS:
        values = info.get(key)
        if values is not None and (not isinstance(values, list) or not values
                                   or not all(_positive(v) for v in values)):
            problems.append(f"{name}: extra_info.{key} is {values!r}, not a list of finite "
                            "positive numbers")
    return problems


def run_problems(data: object) -> list[str]:
    """Why a saved run's JSON cannot be trusted by a reader; [] when it can."""
    if not isinstance(data, dict):
        return [f"a JSON {type(data).__name__}, not an object"]
    machine, commit = data.get("machine_info"), data.get("commit_info")
    problems = []
    for info, key, what in ((machine, "device_name", "machine_info.device_name (the GPU model)"),
                            (commit, "id", "commit_info.id (the commit measured)")):
        if not isinstance(info, dict) or not isinstance(info.get(key), str) or not info[key]:
            problems.append(f"{what} is missing")
    if isinstance(machine, dict):
        probes = machine.get(keys.HOST_PYTHON_LOOP_MS_RUNS, [])
        single = machine.get(keys.HOST_PYTHON_LOOP_MS)
        values = [*(probes if isinstance(probes, list) else [probes]),
                  *([] if single is None else [single])]
        if not all(_positive(v) for v in values):
            problems.append("machine_info's host speed probe is not a positive number of ms")
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list):
        return [*problems, "no benchmarks list"]
    for index, bench in enumerate(benchmarks):
        problems += benchmark_problems(bench, index)
    return problems


def read_run(path: Path) -> dict:
    """A saved run's JSON after `run_problems` found nothing wrong with it; otherwise
    MalformedRunError naming the file and its first few problems, so no half-read run or
    unusable number reaches a table."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MalformedRunError(f"{path}: not a benchmark run ({error})") from error
    problems = run_problems(data)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise MalformedRunError(f"{path}: not a usable benchmark run: "
                                f"{'; '.join(problems[:3])}{more}")
    return data


def gpu_model(run: dict) -> str:
    """The GPU model a validated run was measured on."""
    return str(run["machine_info"]["device_name"])


def check_same_gpu(baseline: dict, current_gpu: str, what: str) -> None:
    """ValueError unless the validated `baseline` was measured on `current_gpu`: times of
    two GPU models are never compared."""
    if gpu_model(baseline) != current_gpu:
        raise ValueError(f"{what} was measured on {gpu_model(baseline)}, this run on "
                         f"{current_gpu}: runs of different GPU models are never compared")


def check_writable_folder(folder: Path) -> None:
    """Create `folder` if needed and write a scratch file in it: an output destination is
    checked before any work, whatever the caller (pytest-benchmark release) does later.
    OSError naming the folder otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OSError(error.errno, f"cannot write in {folder}: {error.strerror or error}"
                      ) from None
