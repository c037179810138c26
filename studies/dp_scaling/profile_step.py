"""Where a data-parallel variant's step goes: torch.profiler over a few steps of each variant,
top kernels by device time and top operators by host time, rank 0's view.

    torchrun --nproc-per-node N -m studies.dp_scaling.profile_step --variants none fsdp torch_fsdp2

Same workload as the study (XL fp32, per-rank batch 8 x ctx 128 unless told otherwise).
"""

from __future__ import annotations

import argparse
import statistics

import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from systems.bench.distributed.train_step import TrainSpec, setup_train, teardown_train, train_round
from systems.distributed.process_group import init_from_env
from systems.distributed.rank_pool import worker_state


def profile_variant(spec: TrainSpec, warmup: int, steps: int, rows: int) -> None:
    setup_train(spec)
    for _ in range(warmup):
        train_round()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        times = [train_round()["step_s"] for _ in range(steps)]
    teardown_train()
    if dist.get_rank() != 0:
        return
    events = prof.key_averages()
    # Device events only, user-annotation ranges left out (as the profiler's own "Self CUDA
    # time total"): a CPU operator carries its kernels' time too, and a range spans them.
    device_us = sum(e.self_device_time_total for e in events
                    if e.device_type != DeviceType.CPU and not e.is_user_annotation) / steps
    host_us = sum(e.self_cpu_time_total for e in events) / steps
    print(f"\n=== {spec.variant} {spec}\nstep {statistics.median(times) * 1e3:.1f} ms (median "
          f"of {steps}, profiled); per step: device busy {device_us / 1e3:.1f} ms, host op "
          f"time {host_us / 1e3:.1f} ms")
    print(events.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", nargs="+", default=["none", "fsdp"],
                        help="TrainSpec variants: none, torch_ddp, bucketed, fsdp, ...")
    parser.add_argument("--size", default="xl")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    worker_state["device"] = init_from_env(args.backend)
    for name in args.variants:
        profile_variant(TrainSpec(variant=name, size=args.size), args.warmup, args.steps, args.rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
