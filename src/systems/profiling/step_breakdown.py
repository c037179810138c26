"""Where a train step's time goes: kernel time by category, each beside its floor.

torch.profiler records `steps` steps of a workload (replays, for a step captured in a CUDA
graph); every GPU kernel, copy and memset is put in a category by its name alone
(`systems.profiling.kernel_categories`). Kernels of one stream do not overlap, so the
step's wall time minus the time some kernel ran is time the GPU sat idle. Each category
stands beside its floor: the time its work would take at the matmul ceiling (FLOPs) or at
the copy bandwidth (bytes), where the work has an analytic size. Without a GPU the same
table is built from CPU ops' self time, and says so.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from systems.accounting import attention_flops
from systems.bench.timing import synchronize, time_steps, union_length
from systems.bench.workloads import ModelWorkload, forward_flops
from systems.common.formatting import fmt, markdown_table, shorten
from systems.model.train_step import CUDA_GRAPH_WARMUP
from systems.profiling.kernel_categories import CATEGORIES, classify_kernel

DEFAULT_MATMUL_TFLOPS = 743.0  # bf16 dense matmul 8192^3 on an H100 (the practical ceiling)
COPY_MIB_GPU, COPY_MIB_CPU = 1024, 256  # the copy that measures the bandwidth
TOP_KERNELS = 30  # kernels listed by name beside the categories

_ANNOTATION = re.compile(r"^(ProfilerStep|forward|backward|optimizer_step|attention\w*)"
                         r"(#.*)?$")


@dataclass(frozen=True)
class TimedEvent:
    """One kernel, copy or memset on the GPU (or one CPU op's self time): name and span."""

    name: str
    start_us: float
    duration_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


def timed_events(events: Iterable, on_gpu: bool) -> list[TimedEvent]:
    """TimedEvents from `profiler.events()`: device activity on the GPU, else CPU ops' self
    time (annotations such as the NVTX phase ranges left out: they are not work)."""
    selected = []
    for event in events:
        device = str(event.device_type).rsplit(".", 1)[-1]
        if on_gpu and device == "CUDA":
            selected.append(TimedEvent(event.name, event.time_range.start,
                                       event.time_range.end - event.time_range.start))
        elif (not on_gpu and device == "CPU" and not _ANNOTATION.match(event.name)
              and not getattr(event, "is_user_annotation", False)
              and event.self_cpu_time_total > 0):
            selected.append(TimedEvent(event.name, event.time_range.start,
                                       event.self_cpu_time_total))
    return selected


def busy_us(events: Sequence[TimedEvent]) -> float:
    """Time during which at least one event ran (the union of their spans)."""
    return union_length((event.start_us, event.end_us) for event in events)


@dataclass(frozen=True)
class Breakdown:
    """Time per step by category (seconds), the step's wall time and the idle gap."""

    steps: int
    wall_s: float
    category_s: dict[str, float]
    busy_s: float
    events_per_step: float
    kernel_s: dict[str, float]  # per kernel (or op) name, longest first

    @property
    def summed_s(self) -> float:
        return sum(self.category_s.values())

    @property
    def idle_s(self) -> float:
        # Overlapping events (several streams) would make the sum exceed the busy time:
        # the gap is measured against the union.
        return max(self.wall_s - self.busy_s, 0.0)


def aggregate(events: Sequence[TimedEvent], steps: int, wall_s: float,
              on_gpu: bool = True) -> Breakdown:
    """Sum `events` (recorded over `steps` steps of `wall_s` seconds each) by category.

    On the GPU the busy time is the union of the kernels' spans; CPU ops' self times do
    not overlap by construction but their spans do (an op holds its children), so there
    the busy time is their sum."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not events:
        raise ValueError("the profiler recorded no kernels (or ops) to break down")
    totals = dict.fromkeys(CATEGORIES, 0.0)
    by_name: dict[str, float] = {}
    for event in events:
        totals[classify_kernel(event.name)] += event.duration_us
        by_name[event.name] = by_name.get(event.name, 0.0) + event.duration_us
    busy = busy_us(events) if on_gpu else sum(totals.values())
    per_step = 1 / steps / 1e6
    return Breakdown(steps=steps, wall_s=wall_s,
                     category_s={k: v * per_step for k, v in totals.items()},
                     busy_s=busy * per_step, events_per_step=len(events) / steps,
                     kernel_s={name: us * per_step for name, us in
                               sorted(by_name.items(), key=lambda item: -item[1])})


# ---------------------------------------------------------------------------- floors
@dataclass(frozen=True)
class Ceilings:
    matmul_flops_per_s: float
    copy_bytes_per_s: float
    copy_measured: bool  # measured here by a large copy, or given


def floor_seconds(workload: ModelWorkload, ceilings: Ceilings) -> dict[str, float]:
    """Lower bounds per category, in seconds per step, where the work has an analytic size:
    the projections, SwiGLU and LM head at the matmul ceiling; causal attention's matmuls
    at the same ceiling; the optimizer's reads and writes at the copy bandwidth."""
    if workload.mode != "train_step":
        raise ValueError(f"the breakdown is of train steps, got mode {workload.mode!r}")
    config, batch, seq = workload.config, workload.batch_size, workload.seq_len
    heads = config.num_layers * batch * config.num_heads
    causal = functools.partial(attention_flops, heads, seq, seq, config.head_dim, True)
    # forward_flops counts the unmasked attention matmuls: twice the causal forward's.
    dense = 3 * (forward_flops(config, batch, seq) - 2 * causal("forward"))
    attention = causal("forward_backward")
    return {"matmul": dense / ceilings.matmul_flops_per_s,
            "attention": attention / ceilings.matmul_flops_per_s,
            "optimizer": optimizer_bytes(workload) / ceilings.copy_bytes_per_s}


def adamw_bytes_per_weight(param_size: int, masters: str | None) -> int:
    """Bytes one AdamW step must move per weight whose parameter (and gradient) take
    `param_size` bytes: both fp32 moments read and written, the gradient read, and the
    weights read and written. `masters`: None for fp32 weights updated in place, "fp32"
    for an fp32 master read and written plus the low-precision parameter written, "split"
    for a bf16 parameter and its int16 low bits, both read and written
    (`systems.optim.split_master`)."""
    moments = 2 * 2 * 4
    weights = {None: 2 * 4, "fp32": 2 * 4 + param_size, "split": 2 * (param_size + 2)}
    return moments + param_size + weights[masters]


def optimizer_bytes(workload: ModelWorkload) -> float:
    """Bytes an AdamW step of the workload's optimizer must move (`adamw_bytes_per_weight`):
    `MixedPrecisionAdamW` splits the masters of bf16 parameters and keeps fp32 ones for
    other dtypes."""
    total = 0
    for param in workload.model.parameters():
        masters = None
        if workload.options.optimizer == "mixed_precision":
            masters = "split" if param.dtype == torch.bfloat16 else "fp32"
        total += param.numel() * adamw_bytes_per_weight(param.element_size(), masters)
    return float(total)


def measure_copy_bandwidth(device: torch.device) -> float:
    """Bytes per second (read plus written) of a large same-device copy: the rate any
    kernel that streams memory can at best reach. Best of 5 after one warm-up; 1 GiB on a
    GPU, 256 MiB on the CPU."""
    numel = (COPY_MIB_GPU if device.type == "cuda" else COPY_MIB_CPU) * 2**20 // 4
    source = torch.rand(numel, device=device)
    target = torch.empty_like(source)
    best = time_steps(lambda: target.copy_(source), warmup=1, steps=5, device=device).min
    return 2 * source.numel() * source.element_size() / best


# ---------------------------------------------------------------------------- running
def profile_breakdown(workload: ModelWorkload, *, warmup: int, steps: int
                      ) -> tuple[Breakdown, float]:
    """Warm up, time `steps` steps unprofiled (each synchronised), then record `steps` more
    with torch.profiler and sum them by category. The idle gap is taken against the wall
    time of the profiled steps themselves (the profiler's own host cost included, which
    matters for ordinary steps and hardly for graph replays); the unprofiled mean step
    time is returned beside the breakdown."""
    on_gpu = workload.device.type == "cuda"
    for _ in range(warmup):
        workload.step()
    unprofiled_s = time_steps(workload.step, warmup=0, steps=steps, device=workload.device).mean
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    synchronize(workload.device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            workload.step()
        synchronize(workload.device)
        wall_s = (time.perf_counter() - start) / steps
    return aggregate(timed_events(prof.events(), on_gpu), steps, wall_s, on_gpu), unprofiled_s


def breakdown_rows(breakdown: Breakdown, floors: dict[str, float]) -> list[dict[str, object]]:
    """One row per category (and the idle gap): ms per step, share of the step, floor."""
    rows = []
    for category in CATEGORIES:
        seconds, floor = breakdown.category_s[category], floors.get(category)
        rows.append({"category": category, "ms": seconds * 1e3,
                     "share": seconds / breakdown.wall_s,
                     "floor_ms": None if floor is None else floor * 1e3,
                     "over_floor": None if not floor else seconds / floor})
    rows.append({"category": "idle gap", "ms": breakdown.idle_s * 1e3,
                 "share": breakdown.idle_s / breakdown.wall_s, "floor_ms": 0.0,
                 "over_floor": None})
    return rows


def top_kernel_rows(breakdown: Breakdown, count: int = TOP_KERNELS) -> list[dict[str, object]]:
    """The `count` longest kernels (or CPU ops) by summed time: ms per step, category."""
    return [{"kernel": name, "category": classify_kernel(name), "ms": seconds * 1e3,
             "share": seconds / breakdown.wall_s}
            for name, seconds in list(breakdown.kernel_s.items())[:count]]


def breakdown_table(rows: Sequence[dict[str, object]]) -> str:
    return markdown_table(
        ["category", "ms / step", "share of step", "floor ms", "x floor"],
        [[r["category"], fmt(r["ms"], ".4g"), fmt(r["share"], ".1%"),
          fmt(r["floor_ms"], ".4g"), fmt(r["over_floor"], ".3g")] for r in rows])


def recipe_breakdown(workload: ModelWorkload, *, recipe: str, warmup: int, steps: int,
                     matmul_tflops: float, copy_gbps: float | None) -> dict[str, object]:
    """Profile `workload` (built from `recipe`) and return the breakdown as a JSON-ready
    record: what was measured, the ceilings the floors use, and one row per category."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got {warmup} and {steps}")
    if matmul_tflops <= 0 or (copy_gbps is not None and copy_gbps <= 0):
        raise ValueError("the matmul ceiling and the copy bandwidth must be positive")
    on_gpu = workload.device.type == "cuda"
    graphed = workload.options.cuda_graph
    if graphed and warmup <= CUDA_GRAPH_WARMUP:
        raise ValueError(f"warmup must exceed {CUDA_GRAPH_WARMUP} so that the profiled steps "
                         f"are replays of the captured graph, got {warmup}")
    ceilings = Ceilings(
        matmul_flops_per_s=matmul_tflops * 1e12,
        copy_bytes_per_s=(copy_gbps * 1e9 if copy_gbps is not None
                          else measure_copy_bandwidth(workload.device)),
        copy_measured=copy_gbps is None)
    breakdown, unprofiled_s = profile_breakdown(workload, warmup=warmup, steps=steps)
    rows = breakdown_rows(breakdown, floor_seconds(workload, ceilings))
    return {
        "recipe": recipe, "workload": workload.describe(), "device": str(workload.device),
        "measured": ("GPU kernels, CUDA-graph replays" if on_gpu and graphed else
                     "GPU kernels, ordinary steps" if on_gpu else
                     "CPU ops' self time (no GPU)"),
        "warmup": warmup, "steps": steps,
        "matmul_tflops": matmul_tflops, "copy_gbps": ceilings.copy_bytes_per_s / 1e9,
        "copy_bandwidth": "given" if not ceilings.copy_measured else
        f"measured by a {COPY_MIB_GPU if on_gpu else COPY_MIB_CPU} MiB same-device copy",
        "wall_ms": breakdown.wall_s * 1e3, "unprofiled_wall_ms": unprofiled_s * 1e3,
        "busy_ms": breakdown.busy_s * 1e3,
        "summed_ms": breakdown.summed_s * 1e3, "events_per_step": breakdown.events_per_step,
        "rows": rows, "top_kernels": top_kernel_rows(breakdown),
    }


def breakdown_markdown(record: dict[str, object]) -> str:
    """The record of `recipe_breakdown` as a short markdown section."""
    workload = record["workload"]
    return "\n".join([
        f"### {record['recipe']}: {workload['num_layers']} layers x d_model "
        f"{workload['d_model']}, batch {workload['batch_size']} x ctx "
        f"{workload['seq_len']}, {workload['precision']}\n",
        f"Measured: {record['measured']} on {record['device']}; {record['steps']} profiled "
        f"steps after {record['warmup']} warm-up steps. Profiled step wall time "
        f"{record['wall_ms']:.4g} ms (unprofiled: {record['unprofiled_wall_ms']:.4g} ms, mean "
        f"of {record['steps']} synchronised steps), of which something ran for "
        f"{record['busy_ms']:.4g} ms ({record['events_per_step']:.0f} events per step); the "
        "rest is the idle gap.\n",
        f"Floors: matmul and attention FLOPs at {record['matmul_tflops']:g} TFLOP/s; the "
        f"optimizer's bytes at {record['copy_gbps']:.0f} GB/s ({record['copy_bandwidth']}); "
        "'-' where the work has no analytic size. Categories come from kernel names alone "
        "(`systems.profiling.kernel_categories.KERNEL_PATTERNS`): reductions and pointwise "
        "kernels of an uncompiled loss count as norms and elementwise.\n",
        breakdown_table(record["rows"]), "",
        f"The {len(record['top_kernels'])} longest kernels, each name's time summed over the "
        "step:\n",
        markdown_table(["kernel", "category", "ms / step", "share of step"],
                       [[shorten(r["kernel"]), r["category"], fmt(r["ms"], ".4g"),
                         fmt(r["share"], ".1%")] for r in record["top_kernels"]]), "",
    ])
