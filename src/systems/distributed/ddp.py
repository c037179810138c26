"""Data-parallel wrappers: each rank runs the whole model on its slice of the batch.

All four variants share `_DataParallel` and differ only in how `GradientSynchronizer`
groups and schedules the gradient all-reduces (see grad_sync.py):

| variant                  | buckets            | launched                    |
|--------------------------|--------------------|-----------------------------|
| NaiveDDP                 | one per parameter  | after backward              |
| FlatDDP                  | one for everything | after backward              |
| DDPIndividualParameters  | one per parameter  | during backward (hooks)     |
| DDPBucketed              | bucket_size_mb     | during backward (hooks)     |

Every variant accumulates gradients over several backwards inside `no_sync()` (as torch
DDP does) and copes with ranks that disagree on which parameters got gradients.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from systems.distributed.grad_sync import GradientSynchronizer, LocalAccumulation
from systems.distributed.process_group import broadcast_module_state

_MIB = 2**20


class _DataParallel(LocalAccumulation, nn.Module):
    """Broadcasts rank 0's state at construction; averages gradients on request."""

    def __init__(self, module: nn.Module, *, bucket_bytes: float | None, overlap: bool) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialise the default process group before wrapping a model")
        self.module = module
        broadcast_module_state(module)
        # parameters() yields a tied parameter once; frozen ones need no communication.
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.grad_sync = GradientSynchronizer(trainable, bucket_bytes, overlap)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # As in torch DDP, whether a backward synchronizes is decided by its forward.
        self.grad_sync.require_sync = not self._accumulating
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Wait until every gradient holds its average over ranks; call before step()."""
        self.grad_sync.finish()


class NaiveDDP(_DataParallel):
    """All-reduce each gradient, one by one, after backward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, bucket_bytes=0, overlap=False)


class FlatDDP(_DataParallel):
    """One all-reduce of all gradients flattened into a single buffer, after backward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, bucket_bytes=None, overlap=False)


class DDPIndividualParameters(_DataParallel):
    """Asynchronous all-reduce of each gradient as soon as backward has produced it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module, bucket_bytes=0, overlap=True)


class DDPBucketed(_DataParallel):
    """Gradients packed into buckets of at most `bucket_size_mb` MiB (None: one bucket;
    smaller towards the end of backward, see `grad_sync.make_buckets`),
    in reverse parameter order; a bucket is all-reduced as soon as all its gradients exist.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None) -> None:
        if bucket_size_mb is not None and bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be positive or None, got {bucket_size_mb}")
        bucket_bytes = None if bucket_size_mb is None else bucket_size_mb * _MIB
        super().__init__(module, bucket_bytes=bucket_bytes, overlap=True)
