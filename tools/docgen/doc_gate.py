"""Doc blocks about the regression gate: its constants and the gate tables a run printed."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from systems.common.formatting import markdown_table
from systems.runs import gate


def gate_constants() -> str:
    """The thresholds `systems.runs.gate` applies."""
    return (f"- **threshold** = max(**floor {gate.FLOOR:.0%}**, **{gate.SPREAD_FACTOR:g} x "
            f"spread**, **{gate.DRIFT_FACTOR:g} x drift**); a case whose threshold would "
            f"exceed the **ceiling of {gate.CEILING:.0%}** is `not gated`, and so is a "
            f"wall-timed case whose median is under **{gate.WALL_MIN_S * 1e3:g} ms** or "
            f"whose host spent **{gate.HOST_BOUND_SHARE:.0%} of a round or more** "
            "enqueueing. (Constants of `systems.runs.gate`.)\n")


_GATE_ROW = re.compile(r"^(?P<case>\S+::\S+)\s+(?:(?P<clock>wall|graph replay|device busy)\s+)?"
                       r"(?P<base>[\d.]+)\s+(?P<cur>[\d.]+)\s+"
                       r"(?P<change>[+-][\d.]+%)\s+(?P<threshold>[\d.]+%)\s+(?P<verdict>.+)$")
# "medians vs BASELINE" in a perf session, "perf gate: RUN vs BASELINE" from `baseline judge`
_GATE_BASELINE = re.compile(r"(?:medians|perf gate: \S+) vs (?P<baseline>\S+)")
_GATE_TALLY = re.compile(r"^\d+ (ok|SLOWER|faster|not gated)")


class GateTable(NamedTuple):
    file: str
    baseline: str
    tally: str
    rows: list[dict[str, str]]  # _GATE_ROW's fields, and "test": the case without its path


def _read_gate_table(repo: Path, name: str) -> GateTable:
    lines = (repo / name).read_text().splitlines()
    baseline = next((m["baseline"] for line in lines if (m := _GATE_BASELINE.search(line))), None)
    tally = next((line for line in lines if _GATE_TALLY.match(line)), None)
    rows = [{**m.groupdict(), "test": m["case"].split("::")[-1]}
            for line in lines if (m := _GATE_ROW.match(line.strip()))]
    if baseline is None or tally is None or not rows:
        raise ValueError(f"{name}: not a gate table as the perf session prints it")
    return GateTable(name, baseline, tally, rows)


def _gate_block(repo: Path, files: tuple[str, ...], headers: list[str],
                rows: Callable[[list[GateTable]], list[list]]) -> str:
    """A table of rows from the printed gate tables `files`, and where they come from."""
    tables = [_read_gate_table(repo, f) for f in files]
    baselines = sorted({t.baseline for t in tables})
    return (markdown_table(headers, rows(tables)) + "\n\nTime: each case's pytest-benchmark "
            "round medians (eager end-to-end, or device time for CUDA-graph replay cases), "
            "run against the baseline's; quoted from the gate tables "
            f"{', '.join(f'`{t.file}`' for t in tables)}, which compared with "
            f"{', '.join(f'`{b}`' for b in baselines)} as it was then.\n")


def gate_tallies(repo: Path, *files: str) -> str:
    """Per printed gate table: its tally and the cases it flagged."""
    return _gate_block(repo, files, ["gate table", "tally", "flagged cases"], lambda tables: [
        [f"`{Path(name).name}`", tally, "; ".join(
            f"{r['test']}: {r['base']} -> {r['cur']} ms ({r['change']}, threshold "
            f"{r['threshold']}, {r['verdict']})"
            for r in rows if r["verdict"] in ("SLOWER", "faster")) or "none"]
        for name, _, tally, rows in tables])


def gate_cases(repo: Path, file: str, match: str) -> str:
    """The rows of one printed gate table whose case name contains `match`."""
    def rows(tables: list[GateTable]) -> list[list]:
        found = [[r["test"], r["base"], r["cur"], r["change"], r["threshold"], r["verdict"]]
                 for r in tables[0].rows if match in r["case"]]
        if not found:
            raise ValueError(f"{file}: no case matches {match!r}")
        return found

    return _gate_block(repo, (file,), ["case", "baseline ms", "current ms", "change",
                                       "threshold", "verdict"], rows)


def gate_noise(repo: Path, *files: str) -> str:
    """Across unchanged re-runs: per test function, the largest |change| of a case against
    the baseline, for cases under and over 1 ms."""
    def rows(tables: list[GateTable]) -> list[list]:
        worst: dict[tuple[str, str], tuple[float, str]] = {}
        for r in (r for table in tables for r in table.rows):
            key = (r["test"].split("[")[0], "< 1 ms" if float(r["base"]) < 1 else ">= 1 ms")
            change = float(r["change"].rstrip("%"))
            if abs(change) > abs(worst.get(key, (0.0, ""))[0]):
                worst[key] = (change, r["test"])
        return [[test, size, f"{change:+.1f}%", case]
                for (test, size), (change, case) in sorted(worst.items())]

    return _gate_block(repo, files, ["test", "baseline median", "largest change", "case"], rows)

