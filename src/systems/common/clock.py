"""The timing core's clocks (see systems.bench.timing for what is timed and how): a device
synchronize, and marks that read the host clock or, on CUDA, the device's own.

They live in the bottom layer so that training code (the distributed step timer) can mark
the phases of a step with the same primitives the measuring layer uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# The two kinds of time every recorded number is one of: the host's clock around work
# ended by a synchronize (what a caller sees), or the device's own clock (CUDA events).
WALL = "wall"
DEVICE = "device"


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on `device` (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Mark:
    """A point in a step: on CUDA an event recorded on the current stream (when the
    device reaches this point of its queue), elsewhere a host clock reading."""

    clock: float | None = None
    event: torch.cuda.Event | None = None

    @property
    def kind(self) -> str:
        return DEVICE if self.event is not None else WALL


def mark(device: torch.device | str) -> Mark:
    """A mark now, without waiting for the device."""
    if torch.device(device).type != "cuda":
        return Mark(clock=time.perf_counter())
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return Mark(event=event)


def seconds_between(start: Mark, end: Mark) -> float:
    """Seconds from `start` to `end`; for events, waits until the device reached `end`."""
    if start.kind != end.kind:
        raise ValueError(f"cannot time from a {start.kind} mark to a {end.kind} mark")
    if start.event is not None and end.event is not None:
        end.event.synchronize()
        return start.event.elapsed_time(end.event) / 1e3
    assert start.clock is not None and end.clock is not None
    return end.clock - start.clock
