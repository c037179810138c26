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

from systems.distributed.grad_sync import (
    TAIL_BUCKET_BYTES,
    GradientSynchronizer,
    LocalAccumulation,
)
from systems.distributed.process_group import broadcast_module_state

_MIB = 2**20


class _DataParallel(LocalAccumulation, nn.Module):
    """Broadcasts rank 0's state at construction; averages gradients on request."""

    def __init__(self, module: nn.Module, *, bucket_bytes: float | None, overlap: bool,
                 tail_bytes: float | None = TAIL_BUCKET_BYTES,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialise the default process group before wrapping a model")
        if group is not None and dist.get_world_size(group) != dist.get_world_size():
            raise ValueError("process_group must hold every rank of the default group")
        self.module = module
        broadcast_module_state(module)
        # parameters() yields a tied parameter once; frozen ones need no communication.
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.grad_sync = GradientSynchronizer(trainable, bucket_bytes, overlap,
                                              tail_bytes=tail_bytes, group=group)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # As in torch DDP, whether a backward synchronizes is decided by its forward.
        self.grad_sync.require_sync = not self._accumulating
        return self.module(*args, **kwargs)

    def gradient_reductions(self) -> tuple[GradientSynchronizer]:
        """What averages the gradients, telling its listeners of each bucket it launches
        (`BucketSteps`)."""
        return (self.grad_sync,)

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
    """Gradients packed into buckets of at most `bucket_size_mb` MiB (None: one bucket),
    in reverse parameter order; a bucket is all-reduced as soon as all its gradients exist.

    Towards the end of backward buckets shrink (see `grad_sync.make_buckets`): the last
    holds at most `tail_bucket_mb` MiB, each one before it at most twice the next (None:
    all of `bucket_size_mb`). `process_group`: a group of every rank to all-reduce on
    (default: the default group), e.g. an NCCL communicator limited to fewer thread blocks.
    To step the optimizer on each bucket as soon as its all-reduce lands, see `BucketSteps`.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None, *,
                 tail_bucket_mb: float | None = TAIL_BUCKET_BYTES / _MIB,
                 process_group: dist.ProcessGroup | None = None) -> None:
        for name, value in (("bucket_size_mb", bucket_size_mb),
                            ("tail_bucket_mb", tail_bucket_mb)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value}")
        bucket_bytes = None if bucket_size_mb is None else bucket_size_mb * _MIB
        tail_bytes = None if tail_bucket_mb is None else tail_bucket_mb * _MIB
        super().__init__(module, bucket_bytes=bucket_bytes, overlap=True,
                         tail_bytes=tail_bytes, group=process_group)
