"""Averaging gradients over ranks: buckets of parameters, launched after or during backward.

Every data-parallel variant is one configuration of `GradientSynchronizer`:

- bucket size: 0 (one all-reduce per parameter, in place), a byte budget (parameters packed
  in reverse registration order, which is roughly the order backward produces them), or
  None (everything in one flat buffer);
- overlap: launch each bucket from post-accumulate-grad hooks as soon as its last gradient
  is ready, or launch all buckets in `finish()` after backward.

A parameter that gets no gradient in a step is left out of its bucket's all-reduce, so its
`.grad` stays None as in single-process training. All ranks must agree on which parameters
got gradients (as they do when the control flow does not depend on the local data).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn


@dataclass(eq=False)
class _Bucket:
    params: list[nn.Parameter]
    pending: int = 0  # gradients still to arrive this step
    launched: bool = False
    work: dist.Work | None = None
    flat: torch.Tensor | None = None
    grads: list[torch.Tensor] = field(default_factory=list)

    def reset(self) -> None:
        self.pending, self.launched, self.work, self.flat, self.grads = (
            len(self.params), False, None, None, [])


def make_buckets(
    params: list[nn.Parameter], bucket_bytes: float | None
) -> list[list[nn.Parameter]]:
    """Group `params` in reverse order into buckets of at most `bucket_bytes` bytes.

    A parameter larger than the budget gets a bucket of its own; a bucket never mixes
    dtypes or devices (it is flattened into one tensor). None means a single bucket.
    """
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for param in reversed(params):
        nbytes = param.numel() * param.element_size()
        current = buckets[-1] if buckets else None
        fits = current is not None and (bucket_bytes is None or size + nbytes <= bucket_bytes)
        same_kind = current is not None and (current[0].dtype, current[0].device) == (
            param.dtype, param.device)
        if fits and same_kind:
            current.append(param)
            size += nbytes
        else:
            buckets.append([param])
            size = nbytes
    return buckets


class GradientSynchronizer:
    """Averages the `.grad` of `params` over the default process group."""

    def __init__(self, params: list[nn.Parameter], bucket_bytes: float | None,
                 overlap: bool) -> None:
        self.world_size = dist.get_world_size()
        self.buckets = [_Bucket(group) for group in make_buckets(params, bucket_bytes)]
        for bucket in self.buckets:
            bucket.reset()
        self._hooks = []
        if overlap:
            # Hooks live in C++ where the garbage collector cannot see cycles: they hold the
            # synchronizer weakly, or a dropped model would never be freed.
            this = weakref.ref(self)
            for index, bucket in enumerate(self.buckets):
                for param in bucket.params:
                    self._hooks.append(param.register_post_accumulate_grad_hook(
                        lambda _p, index=index: this()._grad_ready(index)))

    def _grad_ready(self, index: int) -> None:
        bucket = self.buckets[index]
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        bucket.launched = True
        bucket.grads = [p.grad for p in bucket.params if p.grad is not None]
        if not bucket.grads:
            return
        if len(bucket.grads) == 1:  # reduce in place: no copy in or out
            bucket.flat = bucket.grads[0]
        else:
            bucket.flat = torch.cat([g.reshape(-1) for g in bucket.grads])
        bucket.work = dist.all_reduce(bucket.flat, op=dist.ReduceOp.AVG, async_op=True)

    @torch.no_grad()
    def finish(self) -> None:
        """Launch whatever has not been launched, wait for all, write averages to `.grad`."""
        for bucket in self.buckets:
            if not bucket.launched:
                self._launch(bucket)
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
                if bucket.flat is not bucket.grads[0]:
                    offset = 0
                    for grad in bucket.grads:
                        grad.copy_(bucket.flat[offset:offset + grad.numel()].view_as(grad))
                        offset += grad.numel()
            bucket.reset()

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
