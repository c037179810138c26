"""Combine saved pytest-benchmark runs of one GPU into one history file.

Parts of a study saved by separate runs (a GPU call cannot always fit them all) become one
file, so tables and comparisons read them together. Each benchmark keeps its own stats and
says which run it came from. (Parts of one quick-profile run become the GPU's baseline
through `python -m systems.runs.baseline combine`, which uses the same union.)

    python -m systems.runs.combine .benchmarks/<GPU>/studies/0001_a.json 0002_b.json ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from systems.runs.history import read_run


def combine_runs(paths: list[Path]) -> dict:
    """Union of the runs' benchmarks by full name; later runs win. Runs must share a GPU.
    Raises ValueError (naming the file) for a file that is not a benchmark run."""
    return combine_read_runs([(path, read_run(path)) for path in paths])


def combine_read_runs(runs: list[tuple[Path, dict]]) -> dict:
    """`combine_runs` of runs already read (`read_run`), each with its file's path."""
    if not runs:
        raise ValueError("need at least one run to combine")
    devices = {run.get("machine_info", {}).get("device_name") for _, run in runs}
    if len(devices) != 1:
        raise ValueError(f"runs come from different devices: {sorted(map(str, devices))}")
    benchmarks: dict[str, dict] = {}
    for path, run in runs:
        for bench in run["benchmarks"]:
            # A combined input keeps the run each benchmark was measured in.
            bench["extra_info"] = {"source_run": path.name, **(bench.get("extra_info") or {})}
            benchmarks[bench.get("fullname", bench["name"])] = bench
    newest = max(runs, key=lambda item: str(item[1].get("datetime", "")))[1]
    return {
        **newest,
        "benchmarks": list(benchmarks.values()),
        "combined_from": [path.name for path, _ in runs],
    }


def next_run_path(folder: Path, name: str) -> Path:
    """The path pytest-benchmark would give the next saved run called `name`."""
    numbers = [int(m.group(1)) for p in folder.glob("*.json")
               if (m := re.match(r"(\d{4})_", p.name))]
    return folder / f"{max(numbers, default=0) + 1:04d}_{name}.json"


def reserve_run_path(folder: Path, name: str) -> Path:
    """`next_run_path`, claimed by creating it empty with O_EXCL: of two sessions that
    reserve at once, one gets the number and the other the next, so neither overwrites
    the other's run. The caller writes the run there (or removes the empty file)."""
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        path = next_run_path(folder, name)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue  # another session took this number between the glob and the open
        return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m systems.runs.combine",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="saved run JSON files, oldest first")
    parser.add_argument("--name", default="combined", help="suffix of the new file's name")
    args = parser.parse_args(argv)
    try:
        combined = combine_runs(args.runs)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    target = reserve_run_path(args.runs[-1].parent, args.name)
    target.write_text(json.dumps(combined, indent=4))
    print(f"wrote {target} ({len(combined['benchmarks'])} benchmarks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
