"""A noise-aware regression gate: compare medians, with a threshold per case and clock.

A case may carry three clocks: its rounds (wall time, or a CUDA-graph replay's device
time), the device clock (`keys.DEVICE_KERNEL_S`: the device's busy time in profiled rounds,
which host speed cannot move) and, in long attention cases, do_bench's device time of
each call (`keys.DO_BENCH_MEDIAN_MS`, with the L2 cache flushed and the GPU kept busy, so
a clock or thermal state that moves the eager rounds between runs moves it less). Each
clock present in both runs gets its threshold as below; the case is judged on the gated
clock with the smallest threshold (its most stable one), and the table names it.
Host-bound cases also get a host check: the host's time per call relative to the host
speed probe of the same run (`systems.common.host_speed`), against the baseline's runs,
with a threshold from its spread and drift (`host_check`): a slower Python path shows there,
and a slower host alone does not.

Each clock's threshold is the largest of three measured noises, and never below `FLOOR` (the
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

from systems.common.clock import DEVICE, WALL
from systems.runs import keys

FLOOR = 0.06
SPREAD_FACTOR = 2.0
DRIFT_FACTOR = 1.5  # three runs' range understates the drift a fourth run can show
WALL_MIN_S = 2e-3
HOST_BOUND_SHARE = 0.9
CEILING = 0.12  # a 15% slowdown must clear every gated threshold with room for noise
# The device clock leaves the host out: its floor is the GPU's own run-to-run drift (clock
# and thermal state), below the wall floor; a baseline's measured drift widens it.
DEVICE_FLOOR = 0.05
HOST_FLOOR = 0.15  # the probe tracks host-bound steps loosely (docs/benchmarking.md)

# Clock names in the verdict table.
ROUNDS_WALL = "wall"
ROUNDS_REPLAY = "graph replay"
DEVICE_BUSY = "device busy"
DO_BENCH = "do_bench"
DEVICE_CLOCKS = (DEVICE_BUSY, DO_BENCH)  # judged with DEVICE_FLOOR


class Verdict(Enum):
    OK = "ok"
    SLOWER = "SLOWER"
    FASTER = "faster"
    TOO_NOISY = "not gated"
    NEW = "new (no baseline)"
    NOT_RUN = "not run"


@dataclass(frozen=True)
class Clock:
    """One clock's reading of one case in one run: median and IQR of its rounds (seconds),
    and in a pooled baseline each run's median."""

    median: float
    iqr: float
    run_medians: tuple[float, ...] = ()

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
    def of_rounds(cls, rounds: Sequence[float],
                  run_medians: Sequence[float] = ()) -> Clock | None:
        if not rounds:
            return None
        values = sorted(float(r) for r in rounds)
        q1, q3 = (statistics.quantiles(values, n=4) if len(values) > 1
                  else (values[0], values[0]))[::2]
        return cls(statistics.median(values), q3 - q1, tuple(float(m) for m in run_medians))


def _do_bench_clock(info: Mapping[str, object]) -> Clock | None:
    """do_bench's reading in seconds, where a run recorded its median and IQR."""
    median, iqr = info.get(keys.DO_BENCH_MEDIAN_MS), info.get(keys.DO_BENCH_IQR_MS)
    if not isinstance(median, int | float) or not isinstance(iqr, int | float):
        return None
    return Clock(median / 1e3, iqr / 1e3,
                 tuple(m / 1e3 for m in _floats(info, keys.DO_BENCH_RUN_MEDIANS_MS)))


def _floats(info: Mapping[str, object], key: str) -> tuple[float, ...]:
    values = info.get(key)
    return tuple(float(v) for v in values) if isinstance(values, list) else ()


@dataclass(frozen=True)
class Timing:
    """What the gate needs from one case of one run, in seconds."""

    median: float
    iqr: float
    run_medians: tuple[float, ...] = ()  # one per run, where several runs were pooled
    kind: str | None = None  # "wall" or "device" (extra_info["timing"]), if recorded
    host_enqueue: float | None = None  # median host time until step() returned, if recorded
    on_cpu: bool = False  # the work itself ran on the host's CPU (extra_info["device"])
    device_busy: Clock | None = None  # the device clock, where recorded
    do_bench: Clock | None = None  # do_bench's per-call device time, where recorded
    host_rounds: Clock | None = None  # host time until step() returned, per round
    host_probe_ms: tuple[float, ...] = ()  # the run's host speed probe, one per run

    @property
    def rounds(self) -> Clock:
        """The rounds' own clock (wall time, or a graph replay's device time)."""
        return Clock(self.median, self.iqr, self.run_medians)

    @property
    def spread(self) -> float:
        return self.rounds.spread

    @property
    def drift(self) -> float:
        return self.rounds.drift

    @classmethod
    def from_saved(cls, stats: Mapping[str, float],
                   extra_info: Mapping[str, object] | None = None,
                   host_probe_ms: Sequence[float] = ()) -> Timing:
        """From a saved benchmark's `stats` and `extra_info` (pytest-benchmark's JSON), and
        its run's host speed probes."""
        extra_info = extra_info or {}
        run_medians = extra_info.get(keys.RUN_MEDIANS) or ()
        kind = extra_info.get(keys.TIMING)
        enqueue = extra_info.get(keys.HOST_ENQUEUE_S)
        return cls(median=float(stats["median"]), iqr=float(stats["iqr"]),
                   run_medians=tuple(float(m) for m in run_medians),
                   kind=kind if isinstance(kind, str) else None,
                   host_enqueue=float(enqueue) if isinstance(enqueue, int | float) else None,
                   on_cpu=str(extra_info.get(keys.TORCH_DEVICE, "")).startswith("cpu"),
                   device_busy=Clock.of_rounds(
                       _floats(extra_info, keys.DEVICE_KERNEL_S),
                       _floats(extra_info, keys.DEVICE_KERNEL_RUN_MEDIANS)),
                   do_bench=_do_bench_clock(extra_info),
                   host_rounds=Clock.of_rounds(
                       _floats(extra_info, keys.HOST_ENQUEUE_ROUNDS_S),
                       _floats(extra_info, keys.HOST_ENQUEUE_RUN_MEDIANS)),
                   host_probe_ms=tuple(host_probe_ms))

    def device_clock(self, name: str) -> Clock | None:
        """The reading of one of `DEVICE_CLOCKS`, where recorded."""
        return {DEVICE_BUSY: self.device_busy, DO_BENCH: self.do_bench}[name]

    @property
    def rounds_clock(self) -> str:
        return ROUNDS_REPLAY if self.kind == DEVICE else ROUNDS_WALL

    @property
    def rounds_excluded(self) -> bool:
        """The rounds time the host, whatever their noise (see the module docstring)."""
        return self.short_wall_round or self.host_bound

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
class HostCheck:
    """Host time per call over the run's host speed probe, against the baseline's runs."""

    change: float
    threshold: float

    @property
    def slower(self) -> bool:
        return self.change > self.threshold

    def describe(self) -> str:
        word = "SLOWER" if self.slower else ("faster" if self.change < -self.threshold
                                            else "ok")
        return f"host {word} ({self.change:+.1%}, threshold {self.threshold:.1%})"


def host_check(baseline: Timing, current: Timing) -> HostCheck | None:
    """For a host-bound case whose runs both recorded host rounds and the host probe."""
    if not (baseline.host_bound or current.host_bound):
        return None
    base, cur = baseline.host_rounds, current.host_rounds
    if base is None or cur is None or not baseline.host_probe_ms or not current.host_probe_ms:
        return None
    per_run = (base.run_medians if len(base.run_medians) == len(baseline.host_probe_ms) > 1
               else (base.median,) * len(baseline.host_probe_ms))
    relative = [m / probe for m, probe in zip(per_run, baseline.host_probe_ms, strict=True)]
    change = (cur.median / current.host_probe_ms[-1]) / statistics.median(relative) - 1
    drift = max(relative) / min(relative) - 1
    limit = max(HOST_FLOOR, SPREAD_FACTOR * max(base.spread, cur.spread), DRIFT_FACTOR * drift)
    return HostCheck(change, limit)


@dataclass(frozen=True)
class CaseResult:
    name: str
    baseline: Timing | None
    current: Timing | None
    verdict: Verdict
    threshold: float | None = None
    clock: str | None = None  # the clock judged (or, not gated, the least noisy one)
    change: float | None = None  # of that clock's median
    host: HostCheck | None = None

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


def threshold(baseline: Timing | Clock, current: Timing | Clock, floor: float = FLOOR) -> float:
    """The relative change of the median beyond which this case counts as changed."""
    return max(floor, SPREAD_FACTOR * max(baseline.spread, current.spread),
               DRIFT_FACTOR * baseline.drift)


def _clocks(baseline: Timing, current: Timing) -> list[tuple[str, Clock, Clock, bool]]:
    """(name, baseline reading, current reading, excluded) of each clock both runs have."""
    clocks = [(baseline.rounds_clock, baseline.rounds, current.rounds,
               baseline.rounds_excluded or current.rounds_excluded)]
    for name in DEVICE_CLOCKS:
        base, cur = baseline.device_clock(name), current.device_clock(name)
        if base is not None and cur is not None:
            clocks.append((name, base, cur, False))
    return clocks


def judge(name: str, baseline: Timing | None, current: Timing | None) -> CaseResult:
    if baseline is None and current is None:
        raise ValueError(f"{name}: neither a baseline nor a current timing")
    if baseline is None:
        return CaseResult(name, None, current, Verdict.NEW)
    if current is None:
        return CaseResult(name, baseline, None, Verdict.NOT_RUN)
    judged = []
    for clock, base, cur, excluded in _clocks(baseline, current):
        limit = threshold(base, cur, DEVICE_FLOOR if clock in DEVICE_CLOCKS else FLOOR)
        judged.append((excluded or limit > CEILING, limit, clock, cur.median / base.median - 1))
    not_gated, limit, clock, change = min(judged)  # a gated clock first, then the steadiest
    host = host_check(baseline, current)
    if not_gated:
        return CaseResult(name, baseline, current, Verdict.TOO_NOISY, limit, clock, change, host)
    if change > limit:
        verdict = Verdict.SLOWER
    elif change < -limit:
        verdict = Verdict.FASTER
    else:
        verdict = Verdict.OK
    return CaseResult(name, baseline, current, verdict, limit, clock, change, host)


def compare(baseline: Mapping[str, Timing], current: Mapping[str, Timing]) -> list[CaseResult]:
    """Every case of either run, judged; current cases first, in their order."""
    names = [*current, *(name for name in baseline if name not in current)]
    return [judge(name, baseline.get(name), current.get(name)) for name in names]


def regressions(results: list[CaseResult]) -> list[CaseResult]:
    """Cases slower on their gated clock, or slower in the host check."""
    return [r for r in results
            if r.verdict is Verdict.SLOWER or (r.host is not None and r.host.slower)]


def _ms(timing: Timing | None, clock: str | None) -> str:
    if timing is None:
        return "-"
    reading = timing.device_clock(clock) if clock in DEVICE_CLOCKS else timing
    return "-" if reading is None else f"{reading.median * 1e3:.3f}"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def describe(result: CaseResult) -> str:
    """The verdict, and for a case not gated on any clock, why."""
    if result.verdict is not Verdict.TOO_NOISY:
        return result.verdict.value
    if result.clock in DEVICE_CLOCKS:
        return f"not gated (too noisy on every clock: threshold {_pct(result.threshold)})"
    if result.short_wall_round:
        return f"not gated (wall time under {WALL_MIN_S * 1e3:g} ms: host-bound)"
    if (bound := result.host_bound) is not None:
        if bound.on_cpu:
            return "not gated (host-bound: runs on the CPU)"
        return f"not gated (host-bound: enqueueing took {_pct(bound.host_share)} of a round)"
    drift = f", drift between runs {_pct(result.drift)}" if result.drift else ""
    return f"not gated (too noisy: spread {_pct(result.spread)}{drift})"


def gate_table(results: list[CaseResult]) -> str:
    """case, the clock judged, its baseline and current medians, change, threshold,
    verdict, and the host check of host-bound cases; then a tally."""
    header = ("case", "clock", "baseline ms", "current ms", "change", "threshold", "verdict")
    rows = [(r.name, r.clock or "-", _ms(r.baseline, r.clock), _ms(r.current, r.clock),
             _pct(r.change, signed=True), _pct(r.threshold),
             describe(r) + ("" if r.host is None else f"; {r.host.describe()}"))
            for r in results]
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
    tally = [f"{n} {v.value}" for v, n in counts.items() if n]
    gated = [r.clock for r in results if r.verdict in (Verdict.OK, Verdict.SLOWER,
                                                       Verdict.FASTER)]
    tally += [f"{gated.count(clock)} gated on {clock}" for clock in sorted(set(gated))]
    hosts = [r.host for r in results if r.host is not None]
    if hosts:
        tally.append(f"{len(hosts)} host-checked ({sum(h.slower for h in hosts)} slower)")
    lines.append(", ".join(tally))
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
