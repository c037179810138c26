"""The one set of optimizer names every workload, recipe and command line uses, and the one
place that builds an optimizer from its name."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import torch

from systems.optim.adamw import AdamW
from systems.optim.mixed_precision import MixedPrecisionAdamW
from systems.optim.sharded import ShardedOptimizer

WEIGHT_DECAY = 0.01


class OptimizerName(StrEnum):
    """An optimizer by name; each builder accepts the members it can construct.

    ADAMW: `systems.optim.AdamW`. TORCH_ADAMW: `torch.optim.AdamW` at its best (fused on
    CUDA). MIXED_PRECISION: `systems.optim.MixedPrecisionAdamW`. SHARDED: `ShardedOptimizer`
    over our AdamW. TORCH_ZERO: torch's `ZeroRedundancyOptimizer` over our AdamW.
    """

    ADAMW = "adamw"
    TORCH_ADAMW = "torch_adamw"
    MIXED_PRECISION = "mixed_precision"
    SHARDED = "sharded"
    TORCH_ZERO = "torch_zero"


# Retired names: using one is an error that names its replacement.
LEGACY_OPTIMIZER_NAMES = {"ours": OptimizerName.ADAMW, "torch": OptimizerName.TORCH_ADAMW}


def optimizer_name(value: str, accepted: tuple[OptimizerName, ...]) -> OptimizerName:
    """`value` as one of `accepted`, or a ValueError that lists them (and names the
    replacement of a retired name)."""
    if value in LEGACY_OPTIMIZER_NAMES:
        raise ValueError(f"optimizer {value!r} is now called "
                         f"{LEGACY_OPTIMIZER_NAMES[value].value!r}")
    if value not in {a.value for a in accepted}:
        raise ValueError(f"unknown optimizer {value!r}; choose one of "
                         f"{sorted(a.value for a in accepted)}")
    return OptimizerName(value)


def build_optimizer(name: OptimizerName, params: Sequence[torch.nn.Parameter], *, lr: float,
                    device: torch.device, compute_dtype: torch.dtype = torch.float32,
                    cuda_graph: bool = False) -> torch.optim.Optimizer:
    """The optimizer `name` over `params` (weight decay `WEIGHT_DECAY`). `compute_dtype` is
    the parameters' precision under MIXED_PRECISION; `cuda_graph` says the step will be
    captured in a CUDA graph (torch's AdamW then keeps its step counts on the device)."""
    if name == OptimizerName.ADAMW:
        return AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY)
    if name == OptimizerName.MIXED_PRECISION:
        return MixedPrecisionAdamW(params, lr=lr, weight_decay=WEIGHT_DECAY,
                                   compute_dtype=compute_dtype)
    if name == OptimizerName.SHARDED:
        return ShardedOptimizer(params, AdamW, lr=lr, weight_decay=WEIGHT_DECAY)
    if name == OptimizerName.TORCH_ZERO:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=AdamW, lr=lr,
                                       weight_decay=WEIGHT_DECAY)
    return torch.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY,
                             **torch_adamw_settings(device, cuda_graph=cuda_graph))


def torch_adamw_settings(device: torch.device, *, cuda_graph: bool) -> dict[str, bool]:
    """Keyword arguments of `torch.optim.AdamW` for TORCH_ADAMW: one fused kernel over all
    parameters on CUDA (the multi-tensor path elsewhere), and step counts kept on the device
    when the step is captured in a CUDA graph. The learning rate stays a float: it is read
    at capture, and replays keep it, as they keep ours."""
    fused = device.type == "cuda"
    return {"fused": fused, "foreach": not fused, "capturable": cuda_graph}
