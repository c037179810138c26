"""All-reduce benchmark (rank side) and the bandwidth arithmetic behind its numbers."""

from __future__ import annotations

import torch
import torch.distributed as dist

from systems.bench.timing import StepTimer
from systems.distributed.rank_pool import worker_state


def bus_bandwidth_factor(world_size: int) -> float:
    """Bytes each rank sends per byte of data in a ring all-reduce: 2 (n - 1) / n.

    Algorithm bandwidth is size / time; bus bandwidth = algorithm bandwidth x this factor,
    which makes numbers comparable across world sizes (NCCL's convention).
    """
    return 2 * (world_size - 1) / world_size


def bandwidths(size_bytes: int, seconds: float, world_size: int) -> dict[str, float]:
    algbw = size_bytes / seconds / 1e9
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * bus_bandwidth_factor(world_size)}


def timed_allreduces(size_bytes: int, iterations: int) -> list[float]:
    """Run `iterations` all-reduces of a random float32 tensor; seconds of each, this rank.

    A barrier first lines the ranks up, so each rank's times measure the collective, not
    its wait for a late peer; the caller takes the max over ranks.
    """
    device = worker_state["device"]
    key = ("allreduce", size_bytes)
    if worker_state.get("allreduce_key") != key:  # one buffer per size: allocate it once
        worker_state["allreduce_key"] = key
        worker_state["allreduce_data"] = torch.randn(size_bytes // 4, device=device)
    data = worker_state["allreduce_data"]
    dist.barrier()
    times = []
    for _ in range(iterations):
        timer = StepTimer(device)
        dist.all_reduce(data)
        timer.mark("allreduce")
        times.append(timer.intervals()["allreduce"])
    data.div_(dist.get_world_size())  # keep the values bounded across calls
    return times
