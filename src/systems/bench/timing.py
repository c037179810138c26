"""The one way this project times a step: the perf fixture (conftest.py), the CLI
(`python -m systems.bench`), the step breakdown and the distributed step timer use it.

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
  CUDA an event on the current stream, which the distributed step timer uses to split a
  step into phases without stalling the host; elsewhere the host clock (wall time).
Events span the device's timeline between two points of its queue: idle gaps where it
waited on the host are inside, the host's work before the first kernel is not.

Every recorded number says which it is: `TimingStats.kind` and `Mark.kind`, and in a
benchmark's `extra_info` the key `timing` for its rounds (`do_bench_timing` for do_bench's
numbers), is `WALL` ("wall") or `DEVICE` ("device").
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from systems.bench.cuda_graph import CapturedStep
from systems.common.clock import DEVICE, WALL, synchronize


@dataclass(frozen=True)
class TimingStats:
    """Per-step times in seconds, of `kind` WALL or DEVICE, and for wall rounds the host
    time until each step() returned (its enqueue time)."""

    times: tuple[float, ...]
    host_times: tuple[float, ...] = ()
    kind: str = WALL

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

    `slowdown` (test-only, from SYSTEMS_PERF_INJECT_SLOWDOWN) adds that fraction of each
    measured round's own time to the round; warm-up rounds are not slowed.
    """

    def __init__(self, step: Callable[[], object], device: torch.device | str = "cpu", *,
                 slowdown: float = 0.0) -> None:
        self.step = step
        self.device = device
        self.slowdown = slowdown
        self._times: list[float] = []
        self._host_times: list[float] = []
        self._kind = WALL

    def _round(self, *, measured: bool) -> tuple[float, float]:
        start = time.perf_counter()
        self.step()
        enqueued = time.perf_counter() - start
        synchronize(self.device)
        if measured and self.slowdown:
            time.sleep(self.slowdown * (time.perf_counter() - start))
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
        return self._round(measured=True)[0]

    def warm_up(self, rounds: int) -> None:
        """`rounds` untimed rounds; the timed rounds kept so far are dropped."""
        synchronize(self.device)
        for _ in range(rounds):
            self._round(measured=False)
        self._kind = round_kind(self.step)  # a CapturedStep replays from here on
        self._times.clear()
        self._host_times.clear()

    def stats(self) -> TimingStats:
        """The timed rounds since the last warm-up."""
        return TimingStats(tuple(self._times), tuple(self._host_times), self._kind)

    def measure(self, *, warmup: int, rounds: int, drive: Driver = _loop) -> TimingStats:
        """`warmup` untimed rounds, then `rounds` timed ones with the garbage collector
        paused, called by `drive`; the timed rounds' stats."""
        _check_rounds(warmup, rounds)
        self.warm_up(warmup)
        with gc_paused():
            drive(self.timed_round, rounds)
        return self.stats()


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


# A test-only switch: proves that the regression gate catches a slowdown. Never set it for
# a run whose numbers anyone will read (the perf session refuses to record a baseline then).
SLOWDOWN_ENV = "SYSTEMS_PERF_INJECT_SLOWDOWN"


def injected_slowdowns(text: str | None) -> dict[str, float]:
    """'test_end_to_end:0.15,test_attention:0.1' -> {test function name: added fraction}."""
    slowdowns: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, fraction = item.rpartition(":")
        try:
            value = float(fraction)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0 < value <= 10:
            raise ValueError(f"{SLOWDOWN_ENV}: expected 'test_name:fraction' with 0 < fraction "
                             f"<= 10 (e.g. 'test_end_to_end:0.15'), got {item!r}")
        slowdowns[name] = value
    return slowdowns
