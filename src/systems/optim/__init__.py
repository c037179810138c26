"""Optimizers."""

from systems.optim.adamw import AdamW
from systems.optim.mixed_precision import MixedPrecisionAdamW
from systems.optim.names import OptimizerName, build_optimizer
from systems.optim.overlapped import OverlappedUpdates
from systems.optim.sharded import ShardedOptimizer

__all__ = ["AdamW", "MixedPrecisionAdamW", "OptimizerName", "build_optimizer",
           "OverlappedUpdates", "ShardedOptimizer"]
