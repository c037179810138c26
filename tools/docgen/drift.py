"""The `drift` block: run-to-run drift of case medians across saved runs (the data behind
the gate's floor), per case the |change| of its median between consecutive distinct
measurements."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from systems.common.formatting import markdown_table
from systems.runs import keys
from systems.runs.gate import CEILING, SPREAD_FACTOR, Timing, Verdict, judge
from systems.runs.history import read_run


@dataclass(frozen=True)
class Drift:
    name: str
    first: Timing
    second: Timing

    @property
    def change(self) -> float:
        return abs(self.second.median / self.first.median - 1)


def drifts(runs: list[dict], match: str = "") -> list[Drift]:
    """Pairs of consecutive distinct measurements (identical stats: a copy) per case name; a
    case timed with an injected slowdown measures the gate, not the code: left out."""
    seen: dict[str, list[dict]] = {}
    for bench in (bench for run in runs for bench in run["benchmarks"] if match in bench["name"]):
        if not {keys.INJECTED_HOST, keys.INJECTED_DEVICE} & (bench.get("extra_info") or {}).keys():
            stats = seen.setdefault(bench["name"], [])
            if bench["stats"] not in stats:
                stats.append(bench["stats"])
    return [Drift(name, Timing.from_saved(a), Timing.from_saved(b))
            for name, stats in seen.items() for a, b in itertools.pairwise(stats)]


def drift_block(repo: Path, pattern: str, match: str = "", min_ms: float = 1.0) -> str:
    """The `drift` block over the histories matching the glob `pattern`: the |change|
    quantiles of all pairs, of those of cases >= `min_ms` and of those the gate judges
    (spread small enough)."""
    paths = sorted(repo.glob(pattern))
    if not paths:
        raise ValueError(f"no history files match {pattern}")
    pairs = drifts([read_run(p) for p in paths], match)
    long_enough = [p for p in pairs if min(p.first.median, p.second.median) * 1e3 >= min_ms]
    gated = [p for p in long_enough
             if SPREAD_FACTOR * max(p.first.spread, p.second.spread) <= CEILING]
    rows = []
    for label, group in (("all", pairs), (f">= {min_ms:g} ms", long_enough),
                         (f">= {min_ms:g} ms, spread <= {CEILING / SPREAD_FACTOR:.0%}", gated)):
        changes = sorted(p.change for p in group)  # nearest-rank quantiles
        rows.append([label, len(group), len({p.name for p in group}),
                     *(f"{changes[min(len(changes) - 1, int(q * len(changes)))]:.1%}"
                       if changes else "-" for q in (.5, .9, .95, 1))])
    flagged = [p for p in gated if judge(p.name, p.first, p.second).verdict
               in (Verdict.SLOWER, Verdict.FASTER)]
    return (markdown_table(["pairs", "count", "cases", "abs change p50", "p90", "p95", "max"],
                           rows) + f"\n\nThe gate's thresholds would flag {len(flagged)} of the "
            "last row's pairs.\n\nTime: pytest-benchmark round medians of each case, "
            "consecutive distinct measurements"
            f"{f' of cases containing `{match}`' if match else ''}. From the "
            f"{len(paths)} files `{pattern}`.\n")
