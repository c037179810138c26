"""Run-to-run drift of case medians across saved runs: the data behind the gate's floor.

For every case name measured more than once (a measurement copied into a combined file
counts once), the relative change of the median between consecutive measurements, next to
the larger of the two runs' spreads (IQR / median). Prints quantiles for all pairs and for
the pairs the gate would judge (both medians >= --min-ms, spread small enough to gate),
and how many of those the gate's thresholds would flag as changed.

    python -m tools.docgen.drift .benchmarks/NVIDIA_H100_80GB_HBM3/studies/*.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

from systems.runs import keys
from systems.runs.gate import CEILING, SPREAD_FACTOR, Timing, Verdict, judge
from systems.runs.history import MalformedRunError, read_run


@dataclass(frozen=True)
class Drift:
    name: str
    first: Timing
    second: Timing

    @property
    def change(self) -> float:
        return abs(self.second.median / self.first.median - 1)

    @property
    def spread(self) -> float:
        return max(self.first.spread, self.second.spread)

    @property
    def shorter_s(self) -> float:
        return min(self.first.median, self.second.median)


def distinct_measurements(runs: list[dict]) -> dict[str, list[Timing]]:
    """Per case name, the distinct measurements in run order (identical stats = a copy).
    A case timed with an injected slowdown measures the gate, not the code: left out."""
    seen: dict[str, list[dict]] = {}
    for run in runs:
        for bench in run["benchmarks"]:
            if {keys.INJECTED_HOST, keys.INJECTED_DEVICE} & (bench.get("extra_info") or {}).keys():
                continue
            stats = seen.setdefault(bench["name"], [])
            if bench["stats"] not in stats:
                stats.append(bench["stats"])
    return {name: [Timing.from_saved(s) for s in stats] for name, stats in seen.items()}


def drifts(runs: list[dict], match: str = "") -> list[Drift]:
    return [Drift(name, a, b)
            for name, timings in distinct_measurements(runs).items() if match in name
            for a, b in itertools.pairwise(timings)]


def change_quantiles(pairs: list[Drift]) -> list[str]:
    """p50, p90, p95 and max of the pairs' |median change| (nearest rank), as percentages."""
    changes = sorted(p.change for p in pairs)
    return [f"{changes[min(len(changes) - 1, int(q * len(changes)))]:.1%}"
            for q in (.5, .9, .95, 1)]


def judged_groups(pairs: list[Drift], min_ms: float = 1.0) -> list[tuple[str, list[Drift]]]:
    """(label, pairs): all pairs, those of cases at least `min_ms` long, and of those the
    ones whose spread is small enough for the gate to judge them."""
    long_enough = [p for p in pairs if p.shorter_s * 1e3 >= min_ms]
    gated = [p for p in long_enough if SPREAD_FACTOR * p.spread <= CEILING]
    return [("all", pairs), (f">= {min_ms:g} ms", long_enough),
            (f">= {min_ms:g} ms, spread <= {CEILING / SPREAD_FACTOR:.0%}", gated)]


def flagged(pairs: list[Drift]) -> list[Drift]:
    """The pairs the gate's thresholds would call changed."""
    return [p for p in pairs
            if judge(p.name, p.first, p.second).verdict in (Verdict.SLOWER, Verdict.FASTER)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docgen.drift",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="saved run JSON files, oldest first")
    parser.add_argument("--match", default="", help="only case names containing this text")
    parser.add_argument("--min-ms", type=float, default=1.0,
                        help="judged pairs: both medians at least this long")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(path) for path in args.runs]
    except MalformedRunError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    groups = judged_groups(drifts(runs, args.match), args.min_ms)
    for label, pairs in groups:
        if not pairs:
            print(f"{label}: no pairs")
            continue
        p50, p90, p95, top = change_quantiles(pairs)
        print(f"{label}: {len(pairs)} pairs of {len({p.name for p in pairs})} cases; |median "
              f"change| p50 {p50}, p90 {p90}, p95 {p95}, max {top}")
    gated = groups[-1][1]
    print(f"the gate's thresholds would flag {len(flagged(gated))} of these {len(gated)} pairs")
    for pair in sorted(gated, key=lambda p: p.change, reverse=True)[:10]:
        print(f"  {pair.change:6.1%}  ratio {pair.change / pair.spread:4.1f}  spread "
              f"{pair.spread:5.1%}  "
              f"{pair.first.median * 1e3:9.3f} -> {pair.second.median * 1e3:9.3f} ms  "
              f"{pair.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
