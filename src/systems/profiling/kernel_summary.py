"""Where the time goes: kernels (or CPU ops) from a torch.profiler run, by phase and kind.

Each GPU kernel is attributed to the phase whose range (forward / backward / optimizer_step,
see `systems.common.nvtx`) was open on the CPU when its op launched it, and to the
attention sub-range (scores / softmax / final matmul) likewise. Without a GPU the same
tables are built from CPU ops' self time.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from systems.common.formatting import fmt, markdown_table, shorten
from systems.profiling import kernel_categories
from systems.profiling.kernel_categories import KINDS

PHASES = ("forward", "backward", "optimizer_step")
ATTENTION_REGIONS = ("attention_scores", "attention_softmax", "attention_final_matmul")
_ANNOTATIONS = {*PHASES, *ATTENTION_REGIONS, "attention"}


@dataclass(frozen=True)
class TimedOp:
    """One kernel execution (or CPU op's self time), attributed to a phase and region."""

    name: str
    op: str
    seconds: float
    phase: str
    region: str | None

    @property
    def kind(self) -> str:
        """'matmul', 'elementwise' or 'other' (`kernel_categories.kind`)."""
        return kernel_categories.kind(self.name, self.op)


class _Ranges:
    """Sorted, non-overlapping (start, end, name) ranges; which one holds a time point."""

    def __init__(self, ranges: Iterable[tuple[float, float, str]]) -> None:
        self._ranges = sorted(ranges)
        self._starts = [r[0] for r in self._ranges]

    def at(self, t: float) -> str | None:
        i = bisect.bisect_right(self._starts, t) - 1
        if i >= 0 and t <= self._ranges[i][1]:
            return self._ranges[i][2]
        return None


def collect_timed_ops(events: Sequence, on_gpu: bool) -> list[TimedOp]:
    """TimedOps from `profiler.events()`: GPU kernels via their launching op, or CPU self time."""
    cpu_events = [e for e in events if _is_cpu(e)]
    phases = _ranges(cpu_events, PHASES)
    regions = _ranges(cpu_events, ATTENTION_REGIONS)
    ops = []
    for event in cpu_events:
        start = event.time_range.start
        phase, region = phases.at(start) or "other", regions.at(start)
        if on_gpu:
            # An annotation holds the kernels launched straight from Python inside it (a
            # Triton kernel called without an aten op around it), so it is kept here.
            ops += [TimedOp(k.name, event.name, k.duration / 1e6, phase, region)
                    for k in event.kernels]
        elif event.name not in _ANNOTATIONS and event.self_cpu_time_total > 0:
            ops.append(TimedOp(event.name, event.name, event.self_cpu_time_total / 1e6, phase,
                               region))
    return ops


def _is_cpu(event) -> bool:
    return str(event.device_type).rsplit(".", 1)[-1] == "CPU"


def _ranges(events: Sequence, names: Sequence[str]) -> _Ranges:
    return _Ranges((e.time_range.start, e.time_range.end, e.name)
                   for e in events if e.name in names)


# ------------------------------------------------------------------------------------ tables
def top_kernels_table(ops: Sequence[TimedOp], steps: int, top: int = 15) -> str:
    """The `top` kernels by total time: ms per step, calls per step, share, kind."""
    total = sum(op.seconds for op in ops)
    by_name: dict[str, list[TimedOp]] = defaultdict(list)
    for op in ops:
        by_name[op.name].append(op)
    ranked = sorted(by_name.values(), key=lambda group: -sum(o.seconds for o in group))
    rows = []
    for group in ranked[:top]:
        seconds = sum(o.seconds for o in group)
        rows.append([shorten(group[0].name), group[0].kind, fmt(seconds / steps, ".3f", 1e3),
                     f"{len(group) / steps:g}", fmt(seconds / len(group), ".1f", 1e6),
                     fmt(seconds / total, ".1%")])
    return markdown_table(["kernel", "kind", "ms / step", "calls / step", "mean us", "share"],
                          rows)


def phase_table(ops: Sequence[TimedOp], steps: int) -> str:
    """Per phase: time per step and the share of it in matmuls, elementwise, other."""
    rows = []
    for phase in (*PHASES, "other"):
        in_phase = [op for op in ops if op.phase == phase]
        seconds = sum(op.seconds for op in in_phase)
        if not in_phase:
            continue
        shares = kind_seconds(in_phase)
        rows.append([phase, fmt(seconds / steps, ".2f", 1e3), len(in_phase) // steps,
                     *(fmt(shares[k] / seconds, ".1%") for k in KINDS)])
    return markdown_table(["phase", "ms / step", "calls / step",
                           *(f"{k} share" for k in KINDS)], rows)


def kind_seconds(ops: Iterable[TimedOp]) -> dict[str, float]:
    totals = dict.fromkeys(KINDS, 0.0)
    for op in ops:
        totals[op.kind] += op.seconds
    return totals


def attention_table(ops: Sequence[TimedOp], steps: int, flops: Mapping[str, float]) -> str:
    """Forward attention: scores matmul vs softmax vs final matmul, time against FLOPs."""
    rows = []
    for region in ATTENTION_REGIONS:
        seconds = sum(op.seconds for op in ops if op.region == region) / steps
        if seconds == 0:
            continue
        work = flops.get(region)
        rows.append([region.removeprefix("attention_"), fmt(seconds, ".3f", 1e3),
                     fmt(work, ".3g", 1e-9), fmt(work / seconds if work else None, ".3g", 1e-12)])
    return markdown_table(["part", "ms / step", "GFLOP / step", "TFLOP/s"], rows)

