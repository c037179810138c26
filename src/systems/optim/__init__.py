"""Optimizers."""

from systems.optim.adamw import AdamW
from systems.optim.sharded import ShardedOptimizer

__all__ = ["AdamW", "ShardedOptimizer"]
