"""Load saved pytest-benchmark runs (`.benchmarks/<GPU>/<machine-id>/NNNN_*.json`).

A result is one benchmark of one run; `latest_results` keeps the newest result of every
benchmark across a GPU's runs, naming the run file it came from.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from systems.runs import keys
from systems.runs.validate import MalformedRunError, read_run


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
    file: str = ""  # the history file it was read from, relative to the histories' root

    @property
    def mean(self) -> float:
        return self.stats["mean"]

    @property
    def stddev(self) -> float:
        return self.stats.get("stddev", 0.0)

    @property
    def median(self) -> float:
        return self.stats.get("median", self.stats["mean"])

    @property
    def kind(self) -> str:
        return keys.kind(self.info, self.name)

    @property
    def time_kind(self) -> str:
        return keys.time_kind(self.info, self.name)

    @property
    def measured_in(self) -> tuple[str, str]:
        """(history file, run): results with equal values were measured in one run."""
        return self.file, self.run

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


def load_run(path: Path, root: Path | None = None) -> Run:
    """Parse one saved run; the device is machine_info's device_name (our conftest adds it),
    else the GPU folder's name. Results name their file relative to `root` (else by name).
    A run timed with an injected slowdown (the gate's test switch) tests the gate: none of
    its cases, slowed or not, stands for the code's speed, so it has no results."""
    data = read_run(path)
    file = path.relative_to(root).as_posix() if root else path.name
    machine = data.get("machine_info", {})
    device = machine.get("device_name") or path.parent.parent.name
    when = str(data.get("datetime", ""))
    run = Run(path, device, when, machine)
    if any(key in (b.get("extra_info") or {}) for b in data["benchmarks"]
           for key in (keys.INJECTED_HOST, keys.INJECTED_DEVICE)):
        return run
    for bench in data["benchmarks"]:
        info = keys.normalise(bench.get("extra_info") or {})
        run.results.append(Result(
            name=bench["name"], fullname=str(bench.get("fullname", bench["name"])),
            group=bench.get("group"), stats=bench["stats"], info=info,
            run=str(info.get(keys.SOURCE_RUN, path.name)), datetime=when, device=device,
            file=file,
        ))
    return run


def load_runs(root: Path) -> list[Run]:
    """Every run under `root` (searched recursively, at any depth), oldest first; a file
    that is not a run is skipped with one warning on stderr naming it and why."""
    runs = []
    for path in sorted(root.rglob("*.json")):
        try:
            runs.append(load_run(path, root))
        except MalformedRunError as error:
            print(f"skipping {error}", file=sys.stderr)
    return sorted(runs, key=lambda r: (r.datetime, r.path.name))


def find_run(ref: str, root: Path, device: str = "") -> Path:
    """A run file from a path, or from a run id as pytest-benchmark takes it (`0012` or
    `0012_quick_combined`), searched under `root` at any depth, in the GPU folders (the
    first level under `root`) whose name contains `device` (case-insensitive)."""
    path = Path(ref)
    if path.is_file():
        return path
    if not root.is_dir():
        raise FileNotFoundError(f"{ref}: no such file, and no history folder {root} to look "
                                "it up in")
    folders = [f for f in sorted(root.iterdir())
               if f.is_dir() and device.lower() in f.name.lower()]
    found = [p for folder in folders for p in sorted(folder.rglob("*.json"))
             if p.stem == ref or p.stem.startswith(f"{ref}_")]
    if not found:
        where = f"{root}/*{device}*" if device else str(root)
        raise FileNotFoundError(f"{ref}: no such file, and no run with that id under {where}")
    if len(found) > 1:
        raise ValueError(f"run id {ref} is ambiguous: {', '.join(map(str, found))} (give a "
                         "longer id, a path, or --device)")
    return found[0]


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
