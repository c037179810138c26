"""Record CUDA allocation history for model steps; write the timeline, snapshot and summary.
And measure what autograd saves for backward, to check the analytic activation model."""

from __future__ import annotations

import gc
import gzip
import pickle
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from systems.accounting import (
    layer_activation_bytes,
    residual_stream_bytes,
    step_memory,
)
from systems.bench.metrics import is_out_of_memory
from systems.bench.workloads import build_model_workload
from systems.common.formatting import fmt, markdown_table
from systems.model import ModelConfig
from systems.profiling.timeline import (
    Allocation,
    active_timeline,
    largest_allocations,
    plot_timeline,
)

_MAX_TRACE_ENTRIES = 200_000


class NeedsCudaError(RuntimeError):
    """Raised where a measurement exists only for the CUDA caching allocator."""


@dataclass(frozen=True)
class MemoryCase:
    size: str
    config: ModelConfig
    seq_len: int
    precision: str
    mode: str
    batch_size: int = 4

    @property
    def tag(self) -> str:
        return f"{self.size}_ctx{self.seq_len}_{self.mode}_{self.precision}"


@dataclass
class MemoryRun:
    case: MemoryCase
    outcome: str = "ok"
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    timeline_peak: int | None = None
    largest: list[Allocation] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def record_memory(
    case: MemoryCase, *, steps: int, out_dir: Path, max_artifact_mb: float, html: bool,
) -> MemoryRun:
    """Record from model construction through `steps` steps: the first train step creates
    the optimizer state, later ones show the steady state."""
    if not torch.cuda.is_available():
        raise NeedsCudaError("memory snapshots need a CUDA GPU (torch.cuda.memory records "
                             "allocation history only for the CUDA caching allocator)")
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    run = MemoryRun(case)
    torch.cuda.memory._record_memory_history(max_entries=_MAX_TRACE_ENTRIES, stacks="python",
                                             clear_history=True)
    try:
        workload = build_model_workload(
            case.config, batch_size=case.batch_size, seq_len=case.seq_len,
            mode=case.mode, precision=case.precision, device="cuda")
        for i in range(steps):
            print(f"  [{case.tag}] step {i + 1}/{steps}", file=sys.stderr)
            workload.step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    except Exception as error:  # an OOM is this workload's result, not a crash
        if not is_out_of_memory(error):
            raise
        run.outcome = f"out of memory: {str(error).splitlines()[0][:120]}"
        return run
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        workload = None
        gc.collect()
        torch.cuda.empty_cache()
    run.peak_allocated = torch.cuda.max_memory_allocated()
    run.peak_reserved = torch.cuda.max_memory_reserved()
    _summarise_snapshot(run, snapshot, out_dir, max_artifact_mb, html)
    return run


def _summarise_snapshot(run: MemoryRun, snapshot: dict, out_dir: Path, max_mb: float,
                        html: bool) -> None:
    timeline = active_timeline(snapshot, device=torch.cuda.current_device())
    run.timeline_peak = timeline.peak_bytes
    run.largest = largest_allocations(snapshot, device=torch.cuda.current_device())
    tag = run.case.tag
    run.files.append(plot_timeline(timeline, f"{tag}: active CUDA memory",
                                   out_dir / f"memory_{tag}.png"))
    run.files += keep_if_small(out_dir / f"snapshot_{tag}.pickle.gz",
                                gzip.compress(pickle.dumps(snapshot)), max_mb)
    if html:
        from torch.cuda._memory_viz import trace_plot

        run.files += keep_if_small(out_dir / f"memory_{tag}.html",
                                    trace_plot(snapshot).encode(), max_mb)


def keep_if_small(path: Path, payload: bytes, max_mb: float) -> list[Path]:
    """Write `payload` to `path` and return [path], or drop it (returning []) if too big."""
    if len(payload) > max_mb * 2**20:
        print(f"  {path.name}: {len(payload) / 2**20:.1f} MB exceeds {max_mb} MB; not kept",
              file=sys.stderr)
        return []
    path.write_bytes(payload)
    return [path]


# ------------------------------------------------------------------------------- summaries
def activation_arithmetic_table(cases: list[MemoryCase]) -> str:
    """Residual-stream and saved-activation sizes predicted for each shape and precision."""
    rows, seen = [], set()
    for c in cases:
        key = (c.size, c.seq_len, c.precision)
        if key in seen:
            continue
        seen.add(key)
        memory = step_memory(c.config, c.batch_size, c.seq_len, c.precision)
        rows.append([
            c.size, c.batch_size, c.seq_len, c.precision,
            fmt(residual_stream_bytes(c.config, c.batch_size, c.seq_len), ".2f", 1e-6),
            fmt(layer_activation_bytes(c.config, c.batch_size, c.seq_len, c.precision),
                ".1f", 1e-6),
            fmt(memory.activations, ".2f", 2**-30),
            fmt(memory.backward_start, ".2f", 2**-30),
            fmt(memory.optimizer_step, ".2f", 2**-30),
        ])
    return markdown_table(
        ["size", "batch", "ctx", "precision", "residual stream MB", "activations / layer MB",
         "activations GiB", "at backward start GiB", "at optimizer step GiB"], rows)


def peak_memory_table(runs: list[MemoryRun]) -> str:
    """Measured peaks next to the analytic lower bound (`systems.accounting.step_memory`)."""
    rows = []
    for run in runs:
        c = run.case
        predicted = step_memory(c.config, c.batch_size, c.seq_len, c.precision,
                                c.mode).peak
        rows.append([c.size, c.seq_len, c.mode, c.precision,
                     fmt(run.peak_allocated, ".2f", 2**-30),
                     fmt(run.timeline_peak, ".2f", 2**-30),
                     fmt(run.peak_reserved, ".2f", 2**-30), fmt(predicted, ".2f", 2**-30),
                     run.outcome])
    return markdown_table(["size", "ctx", "mode", "precision", "peak allocated GiB",
                           "timeline peak GiB", "peak reserved GiB", "predicted GiB",
                           "outcome"], rows)


def largest_allocations_section(run: MemoryRun) -> str:
    rows = [[fmt(a.size, ".1f", 2**-20), a.count, a.where] for a in run.largest]
    return markdown_table(["size MiB", "count", "allocated at"], rows)


def saved_tensor_bytes(run: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of distinct storages that `run()` saves for backward, minus `exclude`'s (e.g.
    the parameters, which exist anyway). Views of one storage count once."""
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(saved.values())
