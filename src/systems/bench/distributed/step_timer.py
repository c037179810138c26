"""Marking phases of a step on one rank, with the timing core's marks: CUDA events on GPUs
(device time), host clocks on the CPU (wall time)."""

from __future__ import annotations

from itertools import pairwise

import torch

from systems.common.clock import mark, seconds_between


class StepTimer:
    """`mark(name)` closes the phase that began at the previous mark (or construction).

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
