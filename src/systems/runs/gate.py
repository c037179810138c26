"""A noise-aware regression gate: compare medians, with a threshold per case.

Each case's threshold is the largest of three measured noises, and never below `FLOOR` (the
run-to-run drift of medians that even a tight case shows on these shared hosts):
- the spread of its own rounds (the IQR relative to the median, the larger of the
  baseline's and the current run's) times `SPREAD_FACTOR`;
- its drift between runs: a baseline recorded as several complete runs keeps each run's
  median (`extra_info["run_medians"]`), and the relative range of those medians times
  `DRIFT_FACTOR` is a change the case shows with no code change at all.
A case whose threshold would exceed `CEILING` is too noisy to gate and is reported as such
(with the noise that ruled it out), and so is a wall-timed (eager) case that times the
host rather than the GPU: one shorter than `WALL_MIN_S`, where a round times the host's
launches and the synchronize as much as the GPU; one whose host was still enqueueing for
`HOST_BOUND_SHARE` of the round or more; or one whose work runs on the CPU. Such cases
moved beyond the ceiling between unchanged runs whatever their spread within a run had
been: the speed of a shared VM's CPU changes between runs. So a pass never hides a case
that could not have failed.
docs/benchmarking.md gives the measurements behind the constants.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from systems.common.clock import WALL
from systems.runs import keys

FLOOR = 0.06
SPREAD_FACTOR = 2.0
DRIFT_FACTOR = 1.5  # three runs' range understates the drift a fourth run can show
WALL_MIN_S = 2e-3
HOST_BOUND_SHARE = 0.9
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
    run_medians: tuple[float, ...] = ()  # one per run, where several runs were pooled
    kind: str | None = None  # "wall" or "device" (extra_info["timing"]), if recorded
    host_enqueue: float | None = None  # median host time until step() returned, if recorded
    on_cpu: bool = False  # the work itself ran on the host's CPU (extra_info["device"])

    @property
    def spread(self) -> float:
        """IQR relative to the median."""
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def drift(self) -> float:
        """Range of the runs' medians relative to the smallest (0 for a single run)."""
        if len(self.run_medians) < 2:
            return 0.0
        low = min(self.run_medians)
        return max(self.run_medians) / low - 1 if low > 0 else float("inf")

    @classmethod
    def from_saved(cls, stats: Mapping[str, float],
                   extra_info: Mapping[str, object] | None = None) -> Timing:
        """From a saved benchmark's `stats` and `extra_info` (pytest-benchmark's JSON)."""
        extra_info = extra_info or {}
        run_medians = extra_info.get(keys.RUN_MEDIANS) or ()
        kind = extra_info.get(keys.TIMING)
        enqueue = extra_info.get(keys.HOST_ENQUEUE_S)
        return cls(median=float(stats["median"]), iqr=float(stats["iqr"]),
                   run_medians=tuple(float(m) for m in run_medians),
                   kind=kind if isinstance(kind, str) else None,
                   host_enqueue=float(enqueue) if isinstance(enqueue, int | float) else None,
                   on_cpu=str(extra_info.get(keys.TORCH_DEVICE, "")).startswith("cpu"))

    @property
    def short_wall_round(self) -> bool:
        return self.kind == WALL and self.median < WALL_MIN_S

    @property
    def host_share(self) -> float | None:
        """The host's share of a wall-timed round: all of it when the work runs on the
        CPU, else its enqueue time over the round's."""
        if self.kind != WALL:
            return None
        if self.on_cpu:
            return 1.0
        if self.host_enqueue is None or self.median <= 0:
            return None
        return self.host_enqueue / self.median

    @property
    def host_bound(self) -> bool:
        share = self.host_share
        return share is not None and share >= HOST_BOUND_SHARE


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

    @property
    def drift(self) -> float | None:
        return None if self.baseline is None else self.baseline.drift

    @property
    def short_wall_round(self) -> bool:
        """Not gated for its length, whatever its noise."""
        return any(t is not None and t.short_wall_round for t in (self.baseline, self.current))

    @property
    def host_bound(self) -> Timing | None:
        """The run (baseline or current) whose rounds were host-bound, the one with the
        larger host share if both were: not gated for that, whatever its noise."""
        bound = [t for t in (self.baseline, self.current) if t is not None and t.host_bound]
        return max(bound, key=lambda t: t.host_share) if bound else None


def threshold(baseline: Timing, current: Timing, *, floor: float = FLOOR,
              factor: float = SPREAD_FACTOR, drift_factor: float = DRIFT_FACTOR) -> float:
    """The relative change of the median beyond which this case counts as changed."""
    return max(floor, factor * max(baseline.spread, current.spread),
               drift_factor * baseline.drift)


def judge(name: str, baseline: Timing | None, current: Timing | None, *,
          floor: float = FLOOR, factor: float = SPREAD_FACTOR,
          drift_factor: float = DRIFT_FACTOR, ceiling: float = CEILING) -> CaseResult:
    if baseline is None and current is None:
        raise ValueError(f"{name}: neither a baseline nor a current timing")
    if baseline is None:
        return CaseResult(name, None, current, Verdict.NEW)
    if current is None:
        return CaseResult(name, baseline, None, Verdict.NOT_RUN)
    limit = threshold(baseline, current, floor=floor, factor=factor, drift_factor=drift_factor)
    if any(t.short_wall_round or t.host_bound for t in (baseline, current)) or limit > ceiling:
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
    if result.short_wall_round:
        return f"not gated (wall time under {WALL_MIN_S * 1e3:g} ms: host-bound)"
    if (bound := result.host_bound) is not None:
        if bound.on_cpu:
            return "not gated (host-bound: runs on the CPU)"
        return f"not gated (host-bound: enqueueing took {_pct(bound.host_share)} of a round)"
    if result.verdict is Verdict.TOO_NOISY:
        drift = f", drift between runs {_pct(result.drift)}" if result.drift else ""
        return f"not gated (too noisy: spread {_pct(result.spread)}{drift})"
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
    # The rows say why each case was not gated (too noisy, or host-bound).
    lines.append(", ".join(f"{n} {v.value}" for v, n in counts.items() if n))
    return "\n".join(lines)


def host_speed_line(current_ms: float | None, baseline_ms: Sequence[float]) -> str | None:
    """How long the host speed probe (`systems.common.host_speed`) took in the current run
    against the baseline's runs; None unless both recorded it. Evidence for why wall-timed
    cases moved, never part of a verdict."""
    if current_ms is None or not baseline_ms:
        return None
    reference = statistics.median(baseline_ms)
    change = f"{current_ms / reference - 1:+.0%}"
    if len(baseline_ms) == 1:
        seen = f"{reference:.1f} ms in the baseline's run ({change})"
    else:
        seen = (f"{min(baseline_ms):.1f}-{max(baseline_ms):.1f} ms in the baseline's "
                f"{len(baseline_ms)} runs ({change} vs their median)")
    return (f"host speed: a fixed Python loop took {current_ms:.1f} ms in this run, {seen}; "
            "host-bound eager cases can move with it")
