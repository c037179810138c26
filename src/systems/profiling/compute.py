"""Profile a model step with torch.profiler (warm-up outside the trace) and summarise it."""

from __future__ import annotations

import gzip
import sys
from dataclasses import dataclass
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from systems.accounting import reference_attention_part_flops
from systems.bench.timing import synchronize
from systems.bench.workloads import ModelWorkload
from systems.profiling.kernel_summary import (
    attention_table,
    collect_timed_ops,
    phase_table,
    top_kernels_table,
)
from systems.profiling.memory import keep_if_small


@dataclass(frozen=True)
class ComputeProfile:
    """The markdown summary of one profiled workload and where its trace went (if kept)."""

    tag: str
    markdown: str
    trace: Path | None


def profile_workload(
    workload: ModelWorkload, tag: str, *, warmup: int, steps: int, out_dir: Path,
    max_trace_mb: float,
) -> ComputeProfile:
    """Run `warmup` untraced steps, trace `steps` steps, write the gzipped Chrome trace."""
    on_gpu = workload.device.type == "cuda"
    for i in range(warmup):
        print(f"  [{tag}] warm-up step {i + 1}/{warmup}", file=sys.stderr)
        workload.step()
    synchronize(workload.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            print(f"  [{tag}] profiled step {i + 1}/{steps}", file=sys.stderr)
            workload.step()
        synchronize(workload.device)
    ops = collect_timed_ops(prof.events(), on_gpu=on_gpu)
    flops = reference_attention_part_flops(workload.config, workload.batch_size,
                                           workload.seq_len)
    unit = "GPU kernels" if on_gpu else "CPU ops (self time; no GPU)"
    sections = [
        f"### {tag}\n",
        f"{steps} profiled steps after {warmup} warm-up steps; {unit}; times per step.\n",
        "Time by phase and kind of work:\n", phase_table(ops, steps), "",
        "Top kernels:\n" if on_gpu else "Top ops:\n", top_kernels_table(ops, steps), "",
    ]
    attention = attention_table(ops, steps, flops)
    if attention:
        sections += ["Inside attention (forward; softmax FLOPs at "
                     "5 per score):\n", attention, ""]
    trace = _write_trace(prof, out_dir / f"trace_{tag}.json", max_trace_mb)
    return ComputeProfile(tag, "\n".join(sections), trace)


def _write_trace(prof, path: Path, max_mb: float) -> Path | None:
    """Export the Chrome trace gzipped; drop it (returning None) if it exceeds `max_mb`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    payload = gzip.compress(path.read_bytes())
    path.unlink()
    kept = keep_if_small(path.with_suffix(".json.gz"), payload, max_mb)
    return kept[0] if kept else None
