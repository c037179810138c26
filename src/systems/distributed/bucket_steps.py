"""The optimizer step of each DDP bucket (or FSDP unit), started as soon as its gradient
reduction lands.

A plain data-parallel step runs `finish_gradient_synchronization()` and then the whole
optimizer step, so the update waits for the last bucket's all-reduce, and the update of
every bucket reduced long before runs after backward. `BucketSteps` instead queues each
bucket's update when the bucket is launched: on CUDA on a side stream that waits for that
bucket's all-reduce (NCCL's work handle makes the stream wait on the GPU; the host goes on
with backward), so the update runs beside the rest of backward and beside the other
buckets' all-reduces. Backward never reads a bucket's parameters again once all their
gradients exist, which is when the bucket launches. On CPU a wait blocks the host, which
inside backward could stall a rank that the others wait for (ranks that disagree on used
parameters launch buckets at different times): there the updates wait for `step()`, bucket
by bucket, in the order the buckets launched.

Every parameter is updated exactly as `optimizer.step()` would: the same kernel on the
same averaged gradient, once per step (`step_parameters`, as `systems.optim.AdamW` has).
Parameters of no launched bucket (frozen ones, ones no rank used, buckets the sync
launched with only some gradients) are stepped by `step()`, which also makes the current
stream wait for every update.

    steps = BucketSteps(optimizer, ddp)
    loss.backward()
    ddp.finish_gradient_synchronization()
    steps.step()                  # instead of optimizer.step()
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from systems.distributed.grad_sync import check_synchronized


class BucketSteps:
    """Steps `optimizer` bucket by bucket as the all-reduces of `ddp` (a DDP variant of
    this package) land; `step()` ends the step. The optimizer needs `step_parameters`."""

    def __init__(self, optimizer: torch.optim.Optimizer, ddp: nn.Module) -> None:
        if not callable(getattr(optimizer, "step_parameters", None)):
            raise TypeError(f"{type(optimizer).__name__} cannot step some parameters alone "
                            "(no step_parameters): use systems.optim.AdamW")
        reductions = getattr(ddp, "gradient_reductions", None)
        if reductions is None:
            raise TypeError("ddp must be one of this package's data-parallel wrappers "
                            "(a DDP variant or FSDP)")
        sources = reductions()
        reduced = [p for source in sources for p in source.reduced_params()]
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if any(id(p) not in owned for p in reduced):
            raise ValueError("the optimizer must hold every parameter the wrapper reduces")
        self.optimizer = optimizer
        self._stepped: set[int] = set()
        self._in_flight: list[torch.Tensor] = []  # gradients read on the side stream
        self._deferred: list[tuple[list[nn.Parameter], dist.Work]] = []  # CPU: for step()
        devices = {p.device for p in reduced}
        device = next(iter(devices)) if len(devices) == 1 else None
        self._side_stream = (torch.cuda.Stream(device)
                             if device is not None and device.type == "cuda" else None)
        # The synchronizer holds its listener; the listener holds this object weakly, so
        # that dropping it stops the updates (remove() does so at once).
        this = weakref.ref(self)

        def listener(params: list[nn.Parameter], work: dist.Work) -> None:
            steps = this()
            if steps is not None:
                steps._landing(params, work)

        self._sources, self._listener = sources, listener
        for source in sources:
            source.listeners.append(listener)

    def _landing(self, params: list[nn.Parameter], work: dist.Work) -> None:
        if any(id(p) in self._stepped for p in params):
            raise RuntimeError("a parameter's gradients were reduced twice before step(): "
                               "call step() after each synchronizing backward")
        self._stepped.update(id(p) for p in params)
        if self._side_stream is None:
            self._deferred.append((params, work))
            return
        # After everything queued so far (the copies into the bucket included), and after
        # the all-reduce itself; backward goes on queueing on its own stream meanwhile.
        self._side_stream.wait_stream(torch.cuda.current_stream())
        self._in_flight.extend(p.grad for p in params if p.grad is not None)
        with torch.cuda.stream(self._side_stream):
            work.wait()
            self.optimizer.step_parameters(params)

    def step(self) -> None:
        """Step what no bucket did (call it after finish_gradient_synchronization()), make
        the current stream wait for every update, and start the next step."""
        check_synchronized(self.optimizer)
        for params, work in self._deferred:
            work.wait()
            self.optimizer.step_parameters(params)
        self._deferred.clear()
        rest = [p for group in self.optimizer.param_groups for p in group["params"]
                if id(p) not in self._stepped]
        self.optimizer.step_parameters(rest)
        if self._side_stream is not None:
            torch.cuda.current_stream().wait_stream(self._side_stream)
        self._in_flight.clear()
        self._stepped.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def remove(self) -> None:
        """Stop stepping buckets as they land (after a `step()`)."""
        for source in self._sources:
            if self._listener in source.listeners:
                source.listeners.remove(self._listener)
