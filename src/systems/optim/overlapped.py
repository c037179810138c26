"""Optimizer updates that run during backward, beside it, instead of after it.

An AdamW step over a large model is memory-bound work (about 26 bytes per weight for
`MixedPrecisionAdamW`) that a plain step queues only once backward has ended. Nothing in
that update needs the whole backward: a bucket of parameters (one Transformer block's, say)
can be updated as soon as backward has accumulated all their gradients, and backward never
reads those parameters again. `OverlappedUpdates` does that from gradient hooks, on a second
CUDA stream, so the update of one block runs while backward works through the blocks before
it. Every parameter is updated exactly as `optimizer.step()` would: same kernel, same bits.

What it needs: one backward per step (gradient accumulation over several backwards would
update on the first; a second backward before `step()` is refused), and gradients that
arrive while backward runs. A model compiled as one graph accumulates all of its gradients
when that graph's backward ends, so the updates would all start then: compile per block.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from systems.optim.adamw import AdamW

SECOND_BACKWARD = ("a parameter got a second gradient before step(): overlapped updates "
                   "take one backward per step (gradient accumulation would update on the "
                   "first)")


class OverlappedUpdates:
    """Steps `optimizer` bucket by bucket during backward; `step()` ends the step.

    `buckets`: disjoint lists of the optimizer's parameters, each updated in one launch as
    soon as all of its parameters have their gradient (order them as backward reaches them,
    e.g. one per block). Parameters of the optimizer in no bucket, and buckets some of whose
    parameters got no gradient, are stepped by `step()`. On CUDA the updates run on a side
    stream that `step()` joins back into the current one, so a step captured in a CUDA
    graph captures both; elsewhere they run in place, in the hook.
    """

    def __init__(self, optimizer: AdamW, buckets: Sequence[Sequence[torch.nn.Parameter]]
                 ) -> None:
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        seen: set[int] = set()
        for bucket in buckets:
            for param in bucket:
                if id(param) not in owned:
                    raise ValueError("every parameter of a bucket must be the optimizer's")
                if id(param) in seen:
                    raise ValueError("a parameter may be in one bucket only")
                seen.add(id(param))
        self.optimizer = optimizer
        self._buckets = [list(bucket) for bucket in buckets if bucket]
        self._rest = [p for group in optimizer.param_groups for p in group["params"]
                      if id(p) not in seen]
        self._pending = [len(bucket) for bucket in self._buckets]
        self._arrived: set[int] = set()
        # Gradients the side stream reads, held until step() has joined it: a gradient
        # dropped before then (zero_grad without step()) must not have its memory handed
        # to the other stream's next tensor while an update may still read it.
        self._in_flight: list[torch.Tensor] = []
        devices = {p.device for bucket in self._buckets for p in bucket}
        if len(devices) > 1:
            raise ValueError(f"all bucketed parameters must be on one device, got {devices}")
        device = next(iter(devices), None)
        self._side_stream = (torch.cuda.Stream(device)
                             if device is not None and device.type == "cuda" else None)
        # Hooks live in C++, where the garbage collector cannot see cycles: they hold this
        # object weakly, or a dropped model would never be freed; once it is dropped they
        # do nothing.
        this = weakref.ref(self)
        self._hooks = [param.register_post_accumulate_grad_hook(
                           lambda p, number=number: _arrived_grad(this(), p, number))
                       for number, bucket in enumerate(self._buckets) for param in bucket]

    def _arrived_grad(self, param: torch.Tensor, bucket_number: int) -> None:
        if id(param) in self._arrived:
            raise RuntimeError(SECOND_BACKWARD)
        self._arrived.add(id(param))
        self._pending[bucket_number] -= 1
        if self._pending[bucket_number] == 0:
            self._update(self._buckets[bucket_number])

    def _update(self, params: list[torch.nn.Parameter]) -> None:
        if self._side_stream is None:
            self.optimizer.step_parameters(params)
            return
        # After everything queued so far (these gradients included); backward goes on
        # queueing on its own stream meanwhile.
        self._side_stream.wait_stream(torch.cuda.current_stream())
        self._in_flight.extend(p.grad for p in params if p.grad is not None)
        with torch.cuda.stream(self._side_stream):
            self.optimizer.step_parameters(params)

    def step(self) -> None:
        """Update what backward has not (see the class), make the current stream wait for
        every update, and start counting the next step's gradients."""
        leftover = [p for bucket, pending in zip(self._buckets, self._pending, strict=True)
                    if pending for p in bucket]
        self.optimizer.step_parameters(leftover + self._rest)
        if self._side_stream is not None:
            torch.cuda.current_stream().wait_stream(self._side_stream)
        self._in_flight.clear()
        self._pending = [len(bucket) for bucket in self._buckets]
        self._arrived.clear()

    def remove(self) -> None:
        """Stop updating during backward (call it after a `step()`): the optimizer is
        stepped the plain way again."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


def _arrived_grad(updates: OverlappedUpdates | None, param: torch.Tensor,
                  bucket_number: int) -> None:
    if updates is not None:
        updates._arrived_grad(param, bucket_number)
