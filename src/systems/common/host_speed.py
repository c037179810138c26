"""A probe of the host CPU's own speed, saved with every perf run.

On shared cloud VMs a vCPU's speed moves between runs (another tenant, the hypervisor's
scheduling, frequency), and host-bound eager steps can move with it. The probe times a
fixed piece of pure-Python work, so two runs' values differ only by how fast the host ran
it. It is evidence for a reader, not a correction: measured beside such steps, it tracked
them only loosely (a run whose loop was slower than the baseline's could still time a
host-bound step faster).
"""

from __future__ import annotations

import statistics
import time

LOOP_LENGTH = 200_000
REPEATS = 7  # the median of several timings ignores one interrupted by the scheduler


def python_loop_ms(length: int = LOOP_LENGTH, repeats: int = REPEATS) -> float:
    """Median milliseconds, over `repeats` timings, of a plain Python loop summing
    `range(length)`. No torch, no allocation that could wake the garbage collector: only
    the interpreter on this CPU."""
    if length < 1 or repeats < 1:
        raise ValueError(f"length and repeats must be positive, got {length} and {repeats}")
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for value in range(length):
            total += value
        timings.append(time.perf_counter() - start)
    return statistics.median(timings) * 1e3
