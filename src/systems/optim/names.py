"""The one set of optimizer names every workload, recipe and command line uses."""

from __future__ import annotations

from enum import StrEnum


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
