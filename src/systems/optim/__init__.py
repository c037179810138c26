"""Optimizers."""

from systems.optim.adamw import AdamW

__all__ = ["AdamW"]
