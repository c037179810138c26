"""Load saved pytest-benchmark runs (`.benchmarks/<GPU>/<machine-id>/NNNN_*.json`).

A result is one benchmark of one run; `latest_results` keeps the newest result of every
benchmark across a GPU's runs, naming the run file it came from.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from systems.report import keys


@dataclass(frozen=True)
class Result:
    """One benchmark's stats (seconds) and extra_info, and the run it was measured in."""

    name: str
    fullname: str
    group: str | None
    stats: dict
    info: dict
    run: str
    datetime: str
    device: str

    @property
    def mean(self) -> float:
        return self.stats["mean"]

    @property
    def stddev(self) -> float:
        return self.stats.get("stddev", 0.0)

    @property
    def kind(self) -> str:
        return keys.kind(self.info, self.name)

    @property
    def short_run(self) -> str:
        """The run file's name with any 40-digit commit hash cut to 8 digits."""
        return re.sub(r"([0-9a-f]{8})[0-9a-f]{32}", r"\1", self.run)

    def get(self, key: str, default: object = None) -> object:
        return self.info.get(key, default)


@dataclass
class Run:
    path: Path
    device: str
    datetime: str
    machine_info: dict
    results: list[Result] = field(default_factory=list)


def load_run(path: Path) -> Run:
    """Parse one saved run; the device is machine_info's device_name (our conftest adds it),
    else the GPU folder's name."""
    data = json.loads(path.read_text())
    machine = data.get("machine_info", {})
    device = machine.get("device_name") or path.parent.parent.name
    when = data.get("datetime", "")
    run = Run(path, device, when, machine)
    for bench in data.get("benchmarks", []):
        info = keys.normalise(bench.get("extra_info") or {})
        run.results.append(Result(
            name=bench["name"], fullname=bench.get("fullname", bench["name"]),
            group=bench.get("group"), stats=bench["stats"], info=info,
            run=info.get(keys.SOURCE_RUN, path.name), datetime=when, device=device,
        ))
    return run


def load_runs(root: Path) -> list[Run]:
    """Every run under `root` (searched recursively), oldest first; unreadable files are
    reported on stderr and skipped."""
    runs = []
    for path in sorted(root.rglob("*.json")):
        try:
            runs.append(load_run(path))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            print(f"skipping {path}: not a benchmark run ({error})", file=sys.stderr)
    return sorted(runs, key=lambda r: (r.datetime, r.path.name))


def runs_by_device(runs: Iterable[Run]) -> dict[str, list[Run]]:
    grouped: dict[str, list[Run]] = {}
    for run in runs:
        grouped.setdefault(run.device, []).append(run)
    return grouped


def latest_results(runs: Iterable[Run]) -> list[Result]:
    """The newest result of each benchmark (by full name) over `runs` of one device."""
    latest: dict[str, Result] = {}
    for run in sorted(runs, key=lambda r: (r.datetime, r.path.name)):
        for result in run.results:
            latest[result.fullname] = result
    return list(latest.values())
