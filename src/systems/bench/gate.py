"""A noise-aware regression gate: compare medians, with a threshold per case.

Each case's threshold comes from how much that case's own rounds spread (the IQR relative
to the median, the larger of the baseline's and the current run's), times `SPREAD_FACTOR`,
and never below `FLOOR`: the run-to-run drift of medians that even a tight case shows on
these shared hosts (docs/benchmarking.md gives the numbers behind both constants). A case
whose threshold would exceed `CEILING` is too noisy to gate and is reported as such, so a
pass never hides a case that could not have failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

FLOOR = 0.06
SPREAD_FACTOR = 2.0
CEILING = 0.12  # a 15% slowdown must clear every gated threshold with room for noise


class Verdict(Enum):
    OK = "ok"
    SLOWER = "SLOWER"
    FASTER = "faster"
    TOO_NOISY = "not gated"
    NEW = "new (no baseline)"
    NOT_RUN = "not run"


@dataclass(frozen=True)
class Timing:
    """What the gate needs from one case of one run, in seconds."""

    median: float
    iqr: float

    @property
    def spread(self) -> float:
        """IQR relative to the median."""
        return self.iqr / self.median if self.median > 0 else float("inf")

    @classmethod
    def from_stats(cls, stats: Mapping[str, float]) -> Timing:
        return cls(median=float(stats["median"]), iqr=float(stats["iqr"]))


@dataclass(frozen=True)
class CaseResult:
    name: str
    baseline: Timing | None
    current: Timing | None
    verdict: Verdict
    threshold: float | None = None

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        return self.current.median / self.baseline.median - 1

    @property
    def spread(self) -> float | None:
        timings = [t.spread for t in (self.baseline, self.current) if t is not None]
        return max(timings) if timings else None


def threshold(baseline: Timing, current: Timing, *, floor: float = FLOOR,
              factor: float = SPREAD_FACTOR) -> float:
    """The relative change of the median beyond which this case counts as changed."""
    return max(floor, factor * max(baseline.spread, current.spread))


def judge(name: str, baseline: Timing | None, current: Timing | None, *,
          floor: float = FLOOR, factor: float = SPREAD_FACTOR,
          ceiling: float = CEILING) -> CaseResult:
    if baseline is None and current is None:
        raise ValueError(f"{name}: neither a baseline nor a current timing")
    if baseline is None:
        return CaseResult(name, None, current, Verdict.NEW)
    if current is None:
        return CaseResult(name, baseline, None, Verdict.NOT_RUN)
    limit = threshold(baseline, current, floor=floor, factor=factor)
    if limit > ceiling:
        return CaseResult(name, baseline, current, Verdict.TOO_NOISY, limit)
    change = current.median / baseline.median - 1
    if change > limit:
        verdict = Verdict.SLOWER
    elif change < -limit:
        verdict = Verdict.FASTER
    else:
        verdict = Verdict.OK
    return CaseResult(name, baseline, current, verdict, limit)


def compare(baseline: Mapping[str, Timing], current: Mapping[str, Timing],
            **limits: float) -> list[CaseResult]:
    """Every case of either run, judged; current cases first, in their order."""
    names = [*current, *(name for name in baseline if name not in current)]
    return [judge(name, baseline.get(name), current.get(name), **limits) for name in names]


def regressions(results: list[CaseResult]) -> list[CaseResult]:
    return [r for r in results if r.verdict is Verdict.SLOWER]


def _ms(timing: Timing | None) -> str:
    return "-" if timing is None else f"{timing.median * 1e3:.3f}"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def describe(result: CaseResult) -> str:
    if result.verdict is Verdict.TOO_NOISY:
        return f"not gated (too noisy: spread {_pct(result.spread)})"
    return result.verdict.value


def gate_table(results: list[CaseResult]) -> str:
    """case, baseline median, current median, change, threshold, verdict; then a tally."""
    header = ("case", "baseline ms", "current ms", "change", "threshold", "verdict")
    rows = [(r.name, _ms(r.baseline), _ms(r.current), _pct(r.change, signed=True),
             _pct(r.threshold), describe(r)) for r in results]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first, *rest = cells
        return "  ".join([first.ljust(widths[0]),
                          *(c.rjust(w) for c, w in zip(rest[:-1], widths[1:-1], strict=True)),
                          rest[-1]])

    lines = [line(header), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    lines += [line(row) for row in rows]
    counts = {v: sum(r.verdict is v for r in results) for v in Verdict}
    lines.append(", ".join(f"{n} {describe_kind(v)}" for v, n in counts.items() if n))
    return "\n".join(lines)


def describe_kind(verdict: Verdict) -> str:
    return {Verdict.TOO_NOISY: "not gated (too noisy)"}.get(verdict, verdict.value)
