"""Process-group setup shared by spawned workers, torchrun launches and the wrappers."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from systems.common.hardware import gpu_count

# NVLink multicast can take a shared host's GPUs out of service: keep it off in every process.
SAFE_MULTI_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


class RendezvousError(RuntimeError):
    """The ranks did not all join the process group within the timeout."""


def apply_safe_env() -> None:
    """Set the multi-GPU safety variables unless the caller already chose values."""
    for key, value in SAFE_MULTI_GPU_ENV.items():
        os.environ.setdefault(key, value)


def default_backend() -> str:
    """NCCL when every local rank can have its own GPU, else gloo."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = gpu_count()
    return "nccl" if gpus >= local_world and gpus > 0 else "gloo"


def rank_device(backend: str, local_rank: int) -> torch.device:
    """The device a rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_rank(
    *,
    backend: str,
    rank: int,
    world_size: int,
    init_method: str,
    local_rank: int | None = None,
    timeout_s: float = 300.0,
) -> torch.device:
    """Join the default process group and pin this process to its device.

    `timeout_s` bounds the rendezvous and every collective, so a rank whose peers never
    started or died raises instead of waiting forever (RendezvousError at the rendezvous).
    """
    apply_safe_env()
    device = rank_device(backend, rank if local_rank is None else local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            backend=backend, init_method=init_method, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    except dist.DistError as error:  # torch's text starts with what was missing, then C++ frames
        where = (f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
                 if init_method == "env://" else init_method)
        raise RendezvousError(
            f"rank {rank} of a world of {world_size} could not form the process group at "
            f"{where} within {timeout_s:g} s: {str(error).splitlines()[0]} (start every rank, "
            "or allow longer)") from None
    return device


def init_from_env(backend: str | None = None, timeout_s: float = 300.0) -> torch.device:
    """Join the process group described by torchrun's variables (env:// rendezvous)."""
    required = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [key for key in required if key not in os.environ]
    if missing:
        raise RuntimeError(f"not launched by torchrun: {', '.join(missing)} unset")
    return init_rank(
        backend=backend or default_backend(), rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]), init_method="env://",
        local_rank=int(os.environ.get("LOCAL_RANK", "0")), timeout_s=timeout_s,
    )


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0) -> None:
    """Overwrite every parameter and buffer with rank `src`'s values."""
    for tensor in (*module.parameters(), *module.buffers()):
        dist.broadcast(tensor.data, src=src)


# torch 2.13 renamed the flat-tensor collectives (the old names warn there); 2.11 has only
# the old names. Same signatures.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
