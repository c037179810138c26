"""Timing GPU (or CPU) work correctly: explicit warm-up, synchronised measurement."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on `device` (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class TimingStats:
    """Per-step wall times in seconds, and the host time until each step() returned.

    A host time close to the step time means the device waited on the host (launch-bound);
    a much smaller one means the host ran ahead and the device was the limit.
    """

    times: tuple[float, ...]
    host_times: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("TimingStats needs at least one measured step")

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


def time_steps(
    step: Callable[[], object],
    *,
    warmup: int,
    steps: int,
    device: torch.device | str = "cpu",
) -> TimingStats:
    """Run `step` `warmup` times untimed, then time `steps` calls one by one.

    On CUDA each step is bracketed by CUDA events (so host-side launch jitter between steps
    does not count); elsewhere by `time.perf_counter` after a synchronize. Either way the
    host time until each `step()` returned is kept as `host_times`.
    """
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got {warmup=} {steps=}")
    for _ in range(warmup):
        step()
    synchronize(device)
    if torch.device(device).type == "cuda":
        return _time_with_events(step, steps)
    times, host_times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        host_times.append(time.perf_counter() - start)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return TimingStats(tuple(times), tuple(host_times))


def _time_with_events(step: Callable[[], object], steps: int) -> TimingStats:
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(steps)
    ]
    host_times = []
    for start, end in events:
        start.record()
        host_start = time.perf_counter()
        step()
        host_times.append(time.perf_counter() - host_start)
        end.record()
    torch.cuda.synchronize()
    return TimingStats(tuple(start.elapsed_time(end) / 1e3 for start, end in events),
                       tuple(host_times))


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
