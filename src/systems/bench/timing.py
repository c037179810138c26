"""The one way this project times a step: the perf fixture (`systems.bench.pytest_plugin`),
the CLI (`python -m systems.bench`), the step breakdown and the data-parallel ranks
(`StepTimer`) use it.

What a round measures: wall time, what a caller of the step sees. A round runs
host clock start -> `step()` -> device synchronize -> host clock end, so it holds the host's
work (Python, kernel launches) and the device's work, whichever is the limit. The host
time until `step()` returned is kept beside it as the round's enqueue time: close to the
round's time, the device waited on the host (launch-bound); much smaller, the host ran ahead.

Warm-up rounds are the same rounds, run first and untimed (compilation, autotuning and lazy
state happen there). Python's garbage collector is paused over the timed rounds, and
enabled again after them whatever happens: a collection inside a round is noise, not the
step's cost. The perf fixture hands these rounds to pytest-benchmark, whose clock brackets
each one; the CLI keeps the core's own times.

Device time, the device's work alone as near as it can be measured, comes from three places
only:
- a round whose step replays a captured CUDA graph (`CapturedStep`): the host's work is one
  launch, so the round's host-clock time is the graph's device time plus one launch;
- `device_time(fn)`: per-call CUDA-event times from `triton.testing.do_bench` (L2 cache
  flushed between calls), the one place that decides how kernels alone are timed;
- marks (`systems.common.clock`, a layer below so that training code can use them): on
  CUDA an event on the current stream, which `StepTimer` uses to split a step into phases
  without stalling the host; elsewhere the host clock (wall time).
Events span the device's timeline between two points of its queue: idle gaps where it
waited on the host are inside, the host's work before the first kernel is not.

The device clock, beside every round of a GPU case: after the timed rounds, a few more
rounds run under torch.profiler (`device_busy_rounds`), and each one's device busy time is
the union of the spans of the kernels, copies and memsets it launched, read from the
device's own activity records. Host speed cannot move it: a slow host widens the gaps
between kernels, and gaps are not counted. (CUDA events around an eager round would count
those gaps.) The profiled rounds are extra, so the profiler's overhead never lands in a
timed round, and few (`DEVICE_CLOCK_ROUNDS`), so one profiler session per case is the cost.

Every recorded number says which it is: `TimingStats.kind` and `Mark.kind`, and in a
benchmark's `extra_info` the key `timing` for its rounds (`do_bench_timing` for do_bench's
numbers), is `WALL` ("wall") or `DEVICE` ("device").
"""

from __future__ import annotations

import bisect
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from itertools import pairwise

import torch
from torch.torch_version import TorchVersion

from systems.common.clock import DEVICE, WALL, mark, seconds_between, synchronize
from systems.model.cuda_graph import CapturedStep


@dataclass(frozen=True)
class TimingStats:
    """Per-step times in seconds, of `kind` WALL or DEVICE, and for wall rounds the host
    time until each step() returned (its enqueue time)."""

    times: tuple[float, ...]
    host_times: tuple[float, ...] = ()
    kind: str = WALL
    device_busy: tuple[float, ...] = ()  # the device clock of each profiled round

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("TimingStats needs at least one measured step")
        if self.kind not in (WALL, DEVICE):
            raise ValueError(f"kind is {WALL!r} or {DEVICE!r}, got {self.kind!r}")

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def std(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def iqr(self) -> float:
        """Interquartile range of the times (0 for a single one)."""
        if len(self.times) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4)
        return q3 - q1

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def host_median(self) -> float | None:
        return statistics.median(self.host_times) if self.host_times else None

    def summary(self) -> dict[str, float | None]:
        return {k: getattr(self, k)
                for k in ("mean", "std", "median", "min", "max", "host_median")}

    def to_dict(self) -> dict[str, object]:
        return {**self.summary(), **asdict(self)}


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's garbage collector off inside, back as it was after (even on an error)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def round_kind(step: Callable[[], object]) -> str:
    """DEVICE for a step that now replays a captured CUDA graph, else WALL."""
    return DEVICE if isinstance(step, CapturedStep) and step.graph is not None else WALL


# `drive(timed_round, rounds)` calls `timed_round` `rounds` times (pytest-benchmark's
# pedantic in the perf suite, which keeps its own clock around each call).
Driver = Callable[[Callable[[], float], int], None]


def _loop(timed_round: Callable[[], float], rounds: int) -> None:
    for _ in range(rounds):
        timed_round()


class RoundTimer:
    """Rounds of one `step` on one `device` (see the module docstring for what a round is).

    Test-only switches, for proving the gate (never in a run anyone reads):
    `host_slowdown` holds the host, inside each measured round before step()'s time is
    taken, for that fraction of step()'s own host time: host time grows, device work not.
    `device_work` adds, after each measured round's step(), one kernel that keeps the
    device busy for that fraction of the step's device busy time (measured once after the
    warm-up): device work grows, host time not. Warm-up rounds are left alone.
    """

    def __init__(self, step: Callable[[], object], device: torch.device | str = "cpu", *,
                 host_slowdown: float = 0.0, device_work: float = 0.0) -> None:
        self.step = step
        self.device = device
        self.host_slowdown = host_slowdown
        self.device_work = device_work
        self._added_work: Callable[[], None] | None = None
        self._times: list[float] = []
        self._host_times: list[float] = []
        self._device_busy: tuple[float, ...] = ()
        self._kind = WALL

    def _round(self, *, measured: bool) -> tuple[float, float]:
        start = time.perf_counter()
        self.step()
        if measured and self.host_slowdown:
            _hold_host(self.host_slowdown * (time.perf_counter() - start))
        enqueued = time.perf_counter() - start
        if measured and self._added_work is not None:
            self._added_work()
        synchronize(self.device)
        return time.perf_counter() - start, enqueued

    def timed_round(self) -> float:
        """One timed round: its seconds, kept for `stats()`."""
        seconds, enqueued = self._round(measured=True)
        self._times.append(seconds)
        self._host_times.append(enqueued)
        return seconds

    def first_call(self) -> float:
        """The very first call as one round on its own (compilation, JIT and autotuning
        happen there): its seconds; it is not one of the timed rounds."""
        synchronize(self.device)  # work queued before does not count
        return self._round(measured=False)[0]

    def warm_up(self, rounds: int) -> None:
        """`rounds` untimed rounds; the timed rounds kept so far are dropped."""
        synchronize(self.device)
        for _ in range(rounds):
            self._round(measured=False)
        self._kind = round_kind(self.step)  # a CapturedStep replays from here on
        self._times.clear()
        self._host_times.clear()
        self._device_busy = ()

    def stats(self) -> TimingStats:
        """The timed rounds since the last warm-up, and the device clock if profiled."""
        return TimingStats(tuple(self._times), tuple(self._host_times), self._kind,
                           self._device_busy)

    def measure(self, *, warmup: int, rounds: int, drive: Driver = _loop,
                device_rounds: int = 0) -> TimingStats:
        """`warmup` untimed rounds, then `rounds` timed ones with the garbage collector
        paused, called by `drive`, then `device_rounds` profiled ones (the device clock;
        CUDA only); the timed rounds' stats."""
        _check_rounds(warmup, rounds)
        self.warm_up(warmup)
        if self.device_work:
            (busy,) = device_busy_rounds(lambda: self._round(measured=False), 1)
            self._added_work = device_spin(self.device_work * busy, self.device)
        with gc_paused():
            drive(self.timed_round, rounds)
        if device_rounds:
            self._device_busy = device_busy_rounds(lambda: self._round(measured=True),
                                                   device_rounds)
        return self.stats()


def _hold_host(seconds: float) -> None:
    """Keep the host busy (not asleep: a sleep's wake-up is coarser than short steps)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _check_rounds(warmup: int, rounds: int) -> None:
    if warmup < 0 or rounds < 1:
        raise ValueError(f"need warmup >= 0 and rounds >= 1, got {warmup=} {rounds=}")


def interleaved_rounds(steps: Mapping[str, Callable[[], object]], *, warmup: int, rounds: int,
                       device: torch.device | str = "cpu") -> dict[str, TimingStats]:
    """Rounds of several steps taken in turn, the order reversed every other round (A B C,
    C B A, A B C, ...), so that a slow stretch of the host or the GPU falls on all of them
    alike and the order favours none: the ratio of two steps' medians is a comparison made
    in one run, at one time. Each step warms up first; the garbage collector is paused
    over the timed rounds."""
    _check_rounds(warmup, rounds)
    if not steps:
        raise ValueError("interleaved_rounds needs at least one step")
    timers = {name: RoundTimer(step, device) for name, step in steps.items()}
    for timer in timers.values():
        timer.warm_up(warmup)
    order = list(timers.values())
    with gc_paused():
        for index in range(rounds):
            for timer in order if index % 2 == 0 else reversed(order):
                timer.timed_round()
    return {name: timer.stats() for name, timer in timers.items()}


def time_steps(
    step: Callable[[], object],
    *,
    warmup: int,
    steps: int,
    device: torch.device | str = "cpu",
) -> TimingStats:
    """`warmup` untimed rounds of `step`, then `steps` timed rounds (RoundTimer.measure)."""
    return RoundTimer(step, device).measure(warmup=warmup, rounds=steps)


def device_time(fn: Callable[[], object], *, warmup_ms: int = 25,
                rep_ms: int = 100) -> TimingStats:
    """Device time of each call of `fn` (CUDA only): `triton.testing.do_bench`, which runs
    `fn` for about `warmup_ms` untimed, then for about `rep_ms` each call between two CUDA
    events, with the L2 cache flushed before each."""
    if not torch.cuda.is_available():
        raise ValueError("device_time needs a CUDA device (on the CPU a round's wall time "
                         "is the step's time: use time_steps)")
    import triton.testing  # on CUDA hosts only: importing it on the CPU is not needed

    per_call_ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                          return_mode="all")
    return TimingStats(tuple(ms / 1e3 for ms in per_call_ms), kind=DEVICE)


def interleaved_device_time(fns: Mapping[str, Callable[[], object]], *, rounds: int,
                            warmup_ms: int = 25, rep_ms: int = 100) -> dict[str, list[float]]:
    """Each function's device time (`device_time`'s median, seconds) in each of `rounds`
    rounds taken in turn, the order reversed every other round: a clock or thermal drift of
    the GPU falls on all of them alike, so the per-round ratio of two functions compares
    them at one moment. {name: [round 0's median, round 1's, ...]}."""
    _check_rounds(0, rounds)
    if not fns:
        raise ValueError("interleaved_device_time needs at least one function")
    medians: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for index in range(rounds):
        for name in order if index % 2 == 0 else reversed(order):
            medians[name].append(device_time(fns[name], warmup_ms=warmup_ms,
                                             rep_ms=rep_ms).median)
    return medians


class StepTimer:
    """Phases of one step (a data-parallel rank's: backward, gradient sync, optimizer), by
    marks. `mark(name)` closes the phase that began at the previous mark (or construction).

    On CUDA the marks are events on the current stream, so they time the queued GPU work
    without stalling the host; `intervals()` waits for the last one and reads them all.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._marks = [("start", mark(device))]

    @property
    def kind(self) -> str:
        """The timing core's DEVICE (CUDA events) or WALL (host clocks)."""
        return self._marks[0][1].kind

    def mark(self, name: str) -> None:
        self._marks.append((name, mark(self.device)))

    def intervals(self) -> dict[str, float]:
        """Seconds of each phase, plus 'total' from construction to the last mark."""
        if len(self._marks) < 2:
            raise ValueError("StepTimer.intervals() needs at least one mark(name) first")
        result = {name: seconds_between(prev, here)
                  for (_, prev), (name, here) in pairwise(self._marks)}
        result["total"] = seconds_between(self._marks[0][1], self._marks[-1][1])
        return result


# Test-only switches (RoundTimer's host_slowdown and device_work): prove that the gate
# catches a slower GPU and tells a slower host apart. Never set them for a run whose
# numbers anyone will read (the perf session refuses to record a baseline then).
SLOWDOWN_ENV = "SYSTEMS_PERF_INJECT_SLOWDOWN"  # host time only
DEVICE_WORK_ENV = "SYSTEMS_PERF_INJECT_DEVICE_WORK"  # device work only


def injected_slowdowns(text: str | None, env: str = SLOWDOWN_ENV) -> dict[str, float]:
    """'test_end_to_end:0.15,test_attention:0.1' -> {test function name: added fraction}."""
    slowdowns: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, fraction = item.rpartition(":")
        try:
            value = float(fraction)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0 < value <= 10:
            raise ValueError(f"{env}: expected 'test_name:fraction' with 0 < fraction "
                             f"<= 10 (e.g. 'test_end_to_end:0.15'), got {item!r}")
        slowdowns[name] = value
    return slowdowns


# The device clock (see the module docstring).
DEVICE_CLOCK_ROUNDS = 5
ROUND_MARK = "systems.round"


def union_length(spans: Iterable[tuple[float, float]]) -> float:
    """The length covered by the union of [start, end) spans: work on two streams at once
    counts once, a gap between kernels not at all."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total, reach = total + end - max(start, reach), end
    return total


def busy_seconds(spans: Iterable[tuple[int, int]]) -> float:
    """Seconds covered by the union of [start, end) spans in ns (`union_length`)."""
    return union_length(spans) / 1e9


def busy_per_round(rounds: Sequence[tuple[int, int]],
                   work: Iterable[tuple[int, int]]) -> list[float]:
    """Each round's busy seconds: the union of the work spans that started inside it.
    `rounds` are the rounds' (start, end) ns in order; a round ends after a synchronize,
    so its work starts (and ends) inside it."""
    starts = [start for start, _ in rounds]
    spans: list[list[tuple[int, int]]] = [[] for _ in rounds]
    for span in work:
        index = bisect.bisect_right(starts, span[0]) - 1
        if index >= 0 and span[0] < rounds[index][1]:
            spans[index].append(span)
    return [busy_seconds(round_spans) for round_spans in spans]


def _is_device_work(event: object) -> bool:
    """A kernel, copy or memset on the GPU; not a user annotation's span on the device's
    timeline (which covers the gaps between kernels)."""
    from torch.autograd import DeviceType

    return event.device_type() == DeviceType.CUDA and not event.is_user_annotation()


def release_cupti_after_profiling() -> None:
    """Have the profiler detach CUPTI when its session ends (unless TEARDOWN_CUPTI is set).
    Left attached, as it is by default, CUPTI's callbacks slow every kernel launch of the
    process afterwards: the cases timed after a profiled one would pay for it. Detaching
    and re-attaching with CUDA graphs alive is safe from CUDA 12.6 (torch's own rule)."""
    cuda = torch.version.cuda
    if cuda is not None and TorchVersion(cuda) >= "12.6":
        os.environ.setdefault("TEARDOWN_CUPTI", "1")


def device_busy_rounds(run_round: Callable[[], object], rounds: int, *,
                       is_work: Callable[[object], bool] = _is_device_work
                       ) -> tuple[float, ...]:
    """`rounds` calls of `run_round` (a round that ends with a synchronize) under one
    torch.profiler session; each call's device busy seconds (`busy_per_round` of the
    events `is_work` accepts)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
        release_cupti_after_profiling()
    with profile(activities=activities) as prof:
        for _ in range(rounds):
            with record_function(ROUND_MARK):
                run_round()
    events = prof.profiler.kineto_results.events()
    windows = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
                     if e.name() == ROUND_MARK and e.device_type() == DeviceType.CPU)
    if len(windows) != rounds:
        raise RuntimeError(f"the profiler recorded {len(windows)} of {rounds} rounds")
    work = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
            if e.name() != ROUND_MARK and is_work(e)]
    return tuple(busy_per_round(windows, work))


def device_spin(seconds: float, device: torch.device | str) -> Callable[[], None]:
    """A callable that enqueues one kernel keeping the device busy for about `seconds`
    (torch.cuda._sleep spins for a count of GPU clock cycles; the rate is measured once)."""
    cycles = max(1, int(seconds * _cycles_per_second(str(device))))
    return functools.partial(torch.cuda._sleep, cycles)


@functools.cache
def _cycles_per_second(device: str) -> float:
    cycles = 10_000_000
    with torch.cuda.device(torch.device(device)):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        torch.cuda._sleep(cycles)  # the first launch loads the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)
