"""Generated doc blocks about the regression gate: its constants, numbers quoted from the
gate tables a perf session printed, and `tools.docgen.drift` over saved histories."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from systems.common.formatting import markdown_table
from systems.runs import gate
from systems.runs.history import read_run
from tools.docgen import drift


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


@dataclass(frozen=True)
class GateTable:
    file: str
    baseline: str
    tally: str
    rows: list[dict[str, str]]


def read_gate_table(repo: Path, name: str) -> GateTable:
    lines = (repo / name).read_text().splitlines()
    baseline = next((m["baseline"] for line in lines if (m := _GATE_BASELINE.search(line))), None)
    tally = next((line for line in lines if _GATE_TALLY.match(line)), None)
    rows = [m.groupdict() for line in lines if (m := _GATE_ROW.match(line.strip()))]
    if baseline is None or tally is None or not rows:
        raise ValueError(f"{name}: not a gate table as the perf session prints it")
    return GateTable(name, baseline, tally, rows)


def _gate_source(tables: Sequence[GateTable]) -> str:
    baselines = sorted({t.baseline for t in tables})
    return ("Time: each case's pytest-benchmark round medians (eager end-to-end, or device "
            "time for CUDA-graph replay cases), run against the baseline's; quoted from the "
            f"gate tables {', '.join(f'`{t.file}`' for t in tables)}, which compared with "
            f"{', '.join(f'`{b}`' for b in baselines)} as it was then.\n")


def gate_tallies(repo: Path, *files: str) -> str:
    """Per printed gate table: its tally and the cases it flagged."""
    tables = [read_gate_table(repo, f) for f in files]
    rows = [[f"`{Path(t.file).name}`", t.tally,
             "; ".join(f"{_case(r['case'])}: {r['base']} -> {r['cur']} ms ({r['change']}, "
                       f"threshold {r['threshold']}, {r['verdict']})"
                       for r in t.rows if r["verdict"] in ("SLOWER", "faster")) or "none"]
            for t in tables]
    return (markdown_table(["gate table", "tally", "flagged cases"], rows) + "\n\n"
            + _gate_source(tables))


def _case(name: str) -> str:
    return name.split("::")[-1]


def gate_cases(repo: Path, file: str, match: str) -> str:
    """The rows of one printed gate table whose case name contains `match`."""
    table = read_gate_table(repo, file)
    rows = [[_case(r["case"]), r["base"], r["cur"], r["change"], r["threshold"], r["verdict"]]
            for r in table.rows if match in r["case"]]
    if not rows:
        raise ValueError(f"{file}: no case matches {match!r}")
    return (markdown_table(["case", "baseline ms", "current ms", "change", "threshold",
                            "verdict"], rows) + "\n\n" + _gate_source([table]))


def gate_noise(repo: Path, *files: str) -> str:
    """Across unchanged re-runs: per test function, the largest |change| of a case against
    the baseline, for cases under and over 1 ms."""
    tables = [read_gate_table(repo, f) for f in files]
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for t in tables:
        for r in t.rows:
            test = _case(r["case"]).split("[")[0]
            size = "< 1 ms" if float(r["base"]) < 1 else ">= 1 ms"
            change = float(r["change"].rstrip("%"))
            if abs(change) > abs(worst.get((test, size), (0.0, ""))[0]):
                worst[(test, size)] = (change, _case(r["case"]))
    rows = [[test, size, f"{change:+.1f}%", case]
            for (test, size), (change, case) in sorted(worst.items())]
    return (markdown_table(["test", "baseline median", "largest change", "case"], rows)
            + "\n\n" + _gate_source(tables))


def drift_summary(repo: Path, pattern: str, match: str = "") -> str:
    """`python -m tools.docgen.drift` over the history files matching `pattern` (a glob
    relative to the repository root), for case names containing `match`."""
    paths = sorted(repo.glob(pattern))
    if not paths:
        raise ValueError(f"no history files match {pattern}")
    pairs = drift.drifts([read_run(p) for p in paths], match)
    rows = []
    for label, group in drift.judged_groups(pairs):
        changes = [p.change for p in group]
        rows.append([label, len(group), len({p.name for p in group}),
                     *(f"{drift.quantile(changes, q):.1%}" if changes else "-"
                       for q in (.5, .9, .95)),
                     f"{max(changes):.1%}" if changes else "-"])
    flagged = drift.flagged(drift.judged_groups(pairs)[-1][1])
    return (markdown_table(["pairs", "count", "cases", "abs change p50", "p90", "p95", "max"],
                           rows)
            + f"\n\nThe gate's thresholds would flag {len(flagged)} of the last row's pairs.\n\n"
            f"Time: pytest-benchmark round medians of each case, consecutive distinct "
            f"measurements{f' of cases containing `{match}`' if match else ''}. From the "
            f"{len(paths)} files `{pattern}`.\n")
