"""A CPU proxy for a wrapper's host time per step: a model of many thin blocks (48 x
d_model 64, batch 1 x 8) computes next to nothing, so the step time is mostly Python,
hooks and collective launches. Times one train step of each variant on gloo, and with
--profile prints rank 0's top functions by own time (cProfile).

    PYTHONPATH=src torchrun --nproc-per-node 2 -m studies.dp_scaling.host_time_proxy
    PYTHONPATH=src python -m studies.dp_scaling.host_time_proxy --profile   # world size 1

On CPU the gloo collectives move real data, so this bounds the host time from above.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import torch
import torch.distributed as dist

from systems.bench.workloads import build_model_workload
from systems.distributed import FSDP
from systems.model import MODEL_CONFIGS

WRAPS = {"none": None, "fsdp": FSDP}


def step_times(variant: str, layers: int, steps: int,
               profiler: cProfile.Profile | None) -> list[float]:
    config = MODEL_CONFIGS["tiny"].with_overrides(num_layers=layers)
    workload = build_model_workload(config, batch_size=1, seq_len=8, device="cpu",
                                    wrap=WRAPS[variant])
    for _ in range(3):  # the first steps record the orders that prefetching follows
        workload.step()
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        workload.step()
        if profiler is not None:
            profiler.disable()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(WRAPS), choices=list(WRAPS))
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if "RANK" not in os.environ:  # a single process: world size 1
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT="29531")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for variant in args.variants:
        profiler = cProfile.Profile() if args.profile else None
        times = sorted(step_times(variant, args.layers, args.steps, profiler))
        if dist.get_rank() == 0:
            print(f"{variant}: world size {dist.get_world_size()}, step median "
                  f"{1e3 * times[len(times) // 2]:.1f} ms, min {1e3 * times[0]:.1f} ms")
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
