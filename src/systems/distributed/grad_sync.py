"""Averaging gradients over ranks: buckets of parameters, launched after or during backward.

Every data-parallel variant is one configuration of `GradientSynchronizer`:

- bucket size: 0 (one all-reduce per parameter), a byte budget (parameters packed in
  reverse registration order, which is roughly the order backward produces them), or None
  (everything in one bucket);
- overlap: launch each bucket from post-accumulate-grad hooks as soon as its last gradient
  is ready, or launch all buckets in `finish()` after backward.

Gradients live in their bucket, so the all-reduce runs in place with no copy in or out: a
bucket of several parameters owns one flat buffer (allocated once, like torch DDP's
`gradient_as_bucket_view`) and each parameter's `.grad` is a view into it. Autograd adds
into an existing `.grad` in place, so after `zero_grad(set_to_none=False)` gradients stay
views from step to step. After `zero_grad(set_to_none=True)` autograd makes a fresh tensor;
the launch copies it into its view once and points `.grad` at the view. A bucket of one
parameter needs no buffer: its `.grad`, whichever tensor autograd made, is reduced in place.

A parameter that gets no gradient in a step keeps `.grad` None as in single-process
training; its part of the buffer is reduced along and never read. All ranks must agree on
which parameters got gradients (as they do when the control flow does not depend on the
local data). One backward per `finish()`: a second backward before it would add into
gradients that are being reduced.
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
    buffer: torch.Tensor | None = None  # all gradients, flat; only with several params
    views: list[torch.Tensor] = field(default_factory=list)  # params[i]'s part, shaped
    pending: int = 0  # gradients still to arrive this step
    launched: bool = False
    work: dist.Work | None = None

    def __post_init__(self) -> None:
        if len(self.params) > 1:
            first, sizes = self.params[0], [p.numel() for p in self.params]
            self.buffer = torch.zeros(sum(sizes), dtype=first.dtype, device=first.device)
            self.views = [view.view(p.shape) for view, p in
                          zip(self.buffer.split(sizes), self.params, strict=True)]
        self.reset()

    def reset(self) -> None:
        self.pending, self.launched, self.work = len(self.params), False, None


# The bucket launched last, when backward has finished, has nothing left to hide its
# all-reduce behind: it holds at most this much, and each bucket before it at most twice
# the next one's budget, up to the bucket size asked for.
TAIL_BUCKET_BYTES = 64 * 2**20


def make_buckets(
    params: list[nn.Parameter], bucket_bytes: float | None
) -> list[list[nn.Parameter]]:
    """Group `params` into buckets of consecutive parameters in reverse order (the order
    backward produces their gradients), each of at most `bucket_bytes` bytes.

    Budgets shrink towards the end of backward: the last bucket holds at most
    `TAIL_BUCKET_BYTES`, each earlier one at most twice the next, so the communication
    still queued when backward finishes is small. A parameter larger than its budget gets
    a bucket of its own; a bucket never mixes dtypes or devices (its gradients share one
    buffer). None means a single bucket.
    """
    # Filled from the end of backward (forward order), then put in backward order.
    buckets: list[list[nn.Parameter]] = []
    size = 0
    budget = None if bucket_bytes is None else min(bucket_bytes, TAIL_BUCKET_BYTES)
    for param in params:
        nbytes = param.numel() * param.element_size()
        current = buckets[-1] if buckets else None
        fits = current is not None and (budget is None or size + nbytes <= budget)
        same_kind = current is not None and (current[0].dtype, current[0].device) == (
            param.dtype, param.device)
        if fits and same_kind:
            current.append(param)
            size += nbytes
            continue
        if current is not None and budget is not None:
            budget = min(2 * budget, bucket_bytes)
        buckets.append([param])
        size = nbytes
    return [bucket[::-1] for bucket in reversed(buckets)]


class GradientSynchronizer:
    """Averages the `.grad` of `params` over the default process group."""

    def __init__(self, params: list[nn.Parameter], bucket_bytes: float | None,
                 overlap: bool) -> None:
        self.buckets = [_Bucket(group) for group in make_buckets(params, bucket_bytes)]
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
        grads = [p.grad for p in bucket.params if p.grad is not None]
        if not grads:
            return
        flat = grads[0]
        if bucket.buffer is not None:
            for param, view in zip(bucket.params, bucket.views, strict=True):
                if param.grad is not None and param.grad.data_ptr() != view.data_ptr():
                    view.copy_(param.grad)  # a fresh gradient (its .grad was None)
                    param.grad = view
            flat = bucket.buffer
        bucket.work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)

    @torch.no_grad()
    def finish(self) -> None:
        """Launch whatever has not been launched and wait for all: `.grad` holds averages."""
        for bucket in self.buckets:
            if not bucket.launched:
                self._launch(bucket)
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
            bucket.reset()

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
