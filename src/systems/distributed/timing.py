"""Marking phases of a step on one rank: CUDA events on GPUs, host clocks on the CPU."""

from __future__ import annotations

import time
from itertools import pairwise

import torch


class StepTimer:
    """`mark(name)` closes the phase that began at the previous mark (or construction).

    On CUDA the marks are events on the current stream, so they time the queued GPU work
    without stalling the host; `intervals()` synchronises once and reads them all.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = [("start", self._now())]

    def _now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, name: str) -> None:
        self._marks.append((name, self._now()))

    def intervals(self) -> dict[str, float]:
        """Seconds of each phase, plus 'total' from construction to the last mark."""
        if self.cuda:
            self._marks[-1][1].synchronize()

        def seconds(a: object, b: object) -> float:
            return a.elapsed_time(b) / 1e3 if self.cuda else b - a

        result = {name: seconds(prev, here)
                  for (_, prev), (name, here) in pairwise(self._marks)}
        result["total"] = seconds(self._marks[0][1], self._marks[-1][1])
        return result
