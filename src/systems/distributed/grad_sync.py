"""Averaging gradients over ranks: buckets of parameters, launched after or during backward.

Every data-parallel variant is one configuration of `GradientSynchronizer`:

- bucket size: 0 (one all-reduce per parameter), a byte budget (parameters packed in
  reverse registration order, which is roughly the order backward produces them), or None
  (everything in one bucket);
- overlap: launch each bucket from post-accumulate-grad hooks as soon as its last gradient
  is ready, or launch all buckets in `finish()` after backward;
- tail: how small the buckets become towards the end of backward (`make_buckets`);
- group: the process group of the all-reduces (default: the default group), e.g. an NCCL
  communicator limited to fewer thread blocks so that it takes fewer SMs from backward.

Whoever wants to act on a bucket as soon as its all-reduce lands (`BucketSteps` steps the
optimizer on it) registers a listener: it is called with the bucket's parameters and the
all-reduce's work handle as each bucket is launched. Each wrapper's `gradient_reductions()`
names its synchronizers (FSDP's shard reduce-scatters tell listeners the same way).

Gradients live in their bucket, so the all-reduce runs in place with no copy in or out: a
bucket of several parameters owns one flat buffer (allocated once, like torch DDP's
`gradient_as_bucket_view`) and each parameter's `.grad` is a view into it. Autograd adds
into an existing `.grad` in place, so after `zero_grad(set_to_none=False)` gradients stay
views from step to step. After `zero_grad(set_to_none=True)` autograd makes a fresh tensor;
the launch copies it into its view once and points `.grad` at the view. A bucket of one
parameter needs no buffer: its `.grad`, whichever tensor autograd made, is reduced in place.

Buckets launch strictly in order (a ready bucket waits for the ones before it), so every
rank issues the same sequence of all-reduces whatever order its gradients arrive in. The
price: a bucket with a parameter that gets no gradient in this backward holds back the
buckets after it until `finish()`.

Which parameters got gradients may differ between ranks (control flow that depends on
the local data). At each `finish()` the ranks sum, over a separate gloo group, a count per
parameter of the ranks that got its gradient (one all-reduce of one int32 per parameter,
on the host). A gradient some rank got is averaged on every rank, entering as zeros where
it is missing (what torch DDP's find_unused_parameters does); a parameter no rank used
keeps `.grad` as it was (None after zero_grad(set_to_none=True)), and a bucket holding
only such parameters is not communicated.

Accumulation: with `require_sync` False (the wrappers' `no_sync()`) backwards only record
which gradients arrived and add into `.grad` locally; the next backward with it True
launches buckets as usual, and `finish()` launches the rest. Before `finish()`, a second
gradient for a parameter from synchronizing backwards, or any gradient from an
accumulating backward after a synchronizing one, raises: it could land in a bucket that is
already being reduced.

Stepping on gradients a backward produced since the last `finish()` (inside `no_sync()`,
or before the sync) would let each rank apply its own gradients, so replicas diverge
silently (torch DDP allows it). The wrappers never see the optimizer, so one global
optimizer step pre-hook refuses such a step (`mark_unsynchronized`); it is installed at the
first backward and costs one dict check per step while nothing awaits a sync.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook


class LocalAccumulation:
    """`no_sync()` for a data-parallel wrapper (the DDP variants and FSDP): backwards of
    forwards run inside it communicate nothing. The first backward of a forward outside (or,
    failing that, finish_gradient_synchronization()) reduces the accumulated sums over
    ranks. The wrapper reads `_accumulating` when its forward decides how backward syncs."""

    _accumulating = False

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        previous, self._accumulating = self._accumulating, True
        try:
            yield
        finally:
            self._accumulating = previous


@dataclass(eq=False)
class _Bucket:
    params: list[nn.Parameter]
    buffer: torch.Tensor | None = None  # all gradients, flat; only with several params
    views: list[torch.Tensor] = field(default_factory=list)  # params[i]'s part, shaped
    first: int = 0  # index of params[0] among all the synchronizer's parameters
    pending: int = 0  # gradients still to arrive in this step's synchronizing backward
    work: dist.Work | None = None

    def __post_init__(self) -> None:
        if len(self.params) > 1:
            first, sizes = self.params[0], [p.numel() for p in self.params]
            self.buffer = torch.zeros(sum(sizes), dtype=first.dtype, device=first.device)
            self.views = [view.view(p.shape) for view, p in
                          zip(self.buffer.split(sizes), self.params, strict=True)]
        self.reset()

    def reset(self) -> None:
        self.pending, self.work = len(self.params), None


# The bucket launched last, when backward has finished, has nothing left to hide its
# all-reduce behind: it holds at most this much, and each bucket before it at most twice
# the next one's budget, up to the bucket size asked for.
TAIL_BUCKET_BYTES = 64 * 2**20


def make_buckets(
    params: list[nn.Parameter], bucket_bytes: float | None,
    tail_bytes: float | None = TAIL_BUCKET_BYTES,
) -> list[list[nn.Parameter]]:
    """Group `params` into buckets of consecutive parameters in reverse order (the order
    backward produces their gradients), each of at most `bucket_bytes` bytes.

    Budgets shrink towards the end of backward: the last bucket holds at most
    `tail_bytes`, each earlier one at most twice the next, so the communication still
    queued when backward finishes is small (`tail_bytes` None: every budget is
    `bucket_bytes`). A parameter larger than its budget gets a bucket of its own; a bucket
    never mixes dtypes or devices (its gradients share one buffer). None means a single
    bucket.
    """
    if tail_bytes is not None and tail_bytes <= 0:
        raise ValueError(f"tail_bytes must be positive or None, got {tail_bytes}")
    # Filled from the end of backward (forward order), then put in backward order.
    buckets: list[list[nn.Parameter]] = []
    size = 0
    budget = bucket_bytes if bucket_bytes is None or tail_bytes is None else min(
        bucket_bytes, tail_bytes)
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


SECOND_BACKWARD = (
    "a backward reached gradients that a previous backward already started averaging over "
    "ranks: call finish_gradient_synchronization() (and optimizer.step()) after each "
    "backward, or run every backward but the last of an accumulation inside no_sync()")


UNSYNCHRONIZED_STEP = (
    "optimizer.step() on gradients that are not averaged over ranks yet (a backward ran "
    "since the last finish_gradient_synchronization(), e.g. inside no_sync()): each rank "
    "would apply its own gradients and the replicas would diverge. Step once the no_sync() "
    "context has exited, a backward outside it has run and "
    "finish_gradient_synchronization() has returned")

# Per wrapper whose parameters got gradients since its last sync: those parameters' ids.
_UNSYNCHRONIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_step_hook = None


def _refuse_unsynchronized_step(optimizer: torch.optim.Optimizer, _args: object,
                                _kwargs: object) -> None:
    if not _UNSYNCHRONIZED:
        return
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if any(not stepped.isdisjoint(ids) for ids in list(_UNSYNCHRONIZED.values())):
        raise RuntimeError(UNSYNCHRONIZED_STEP)


def check_synchronized(optimizer: torch.optim.Optimizer) -> None:
    """Raise as `optimizer.step()` would on gradients not averaged over ranks yet, for
    steps that do not go through `step()` (`BucketSteps`)."""
    _refuse_unsynchronized_step(optimizer, (), {})


def mark_unsynchronized(owner: object, param_ids: frozenset[int]) -> None:
    """Refuse optimizer steps on `param_ids` until mark_synchronized(owner).

    A refusal rather than a warning: a step on unsynchronized gradients is a bug in every
    loop we know of, and a warning scrolls past while the replicas drift apart.
    """
    global _step_hook
    if _step_hook is None:
        _step_hook = register_optimizer_step_pre_hook(_refuse_unsynchronized_step)
    _UNSYNCHRONIZED[owner] = param_ids


def mark_synchronized(owner: object) -> None:
    _UNSYNCHRONIZED.pop(owner, None)


_HOST_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def host_group() -> dist.ProcessGroup:
    """A gloo group beside the default one, for small agreements between ranks (the usage
    count at each sync, FSDP's collective check).

    Its collectives are ordered apart from the gradient collectives, of which ranks that
    disagree on used parameters have launched different numbers by then; and it runs on
    the host, so it never waits for the device. One per default group, made once.
    """
    world = dist.group.WORLD
    if world not in _HOST_GROUPS:
        _HOST_GROUPS[world] = dist.new_group(backend="gloo")
    return _HOST_GROUPS[world]


class GradientSynchronizer:
    """Averages the `.grad` of `params` over the default process group.

    `require_sync` False (the wrappers' no_sync()) makes backwards only record which
    gradients arrived; the next backward with it True launches buckets, and `finish()`
    completes the step.
    """

    def __init__(self, params: list[nn.Parameter], bucket_bytes: float | None,
                 overlap: bool, *, tail_bytes: float | None = TAIL_BUCKET_BYTES,
                 group: dist.ProcessGroup | None = None) -> None:
        self.buckets = [_Bucket(members) for members
                        in make_buckets(params, bucket_bytes, tail_bytes)]
        self.overlap = overlap
        self.group = group
        # Called with (bucket parameters, all-reduce work) as each bucket is launched.
        self.listeners: list[Callable[[list[nn.Parameter], dist.Work], None]] = []
        self.require_sync = True
        count = sum(len(bucket.params) for bucket in self.buckets)
        self._usage_group = host_group()
        self._param_ids = frozenset(id(p) for bucket in self.buckets for p in bucket.params)
        # Per parameter, in bucket order: got a gradient since the last finish(), and got
        # one in a synchronizing backward.
        self._used = bytearray(count)
        self._synced = bytearray(count)
        self._syncing = False  # a synchronizing backward has begun since the last finish()
        self._pending = False  # a gradient has arrived since the last finish()
        self._next = 0  # buckets launch in order, so every rank issues the same sequence
        # Hooks live in C++ where the garbage collector cannot see cycles: they hold the
        # synchronizer weakly (and no bucket, which holds the parameters), or a dropped
        # model would never be freed.
        this = weakref.ref(self)
        self._hooks = []
        index = 0
        for number, bucket in enumerate(self.buckets):
            bucket.first = index
            for param in bucket.params:
                self._hooks.append(param.register_post_accumulate_grad_hook(
                    lambda _p, index=index, number=number: this()._grad_ready(index, number)))
                index += 1

    def _grad_ready(self, index: int, bucket_number: int) -> None:
        if self._synced[index] or (self._syncing and not self.require_sync):
            raise RuntimeError(SECOND_BACKWARD)
        if not self._pending:
            self._pending = True
            mark_unsynchronized(self, self._param_ids)
        self._used[index] = 1
        if not self.require_sync:
            return
        self._synced[index] = 1
        self._syncing = True
        self.buckets[bucket_number].pending -= 1
        if self.overlap:
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch, in order, the buckets whose gradients have all arrived in this backward
        (nothing adds to them any more)."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            bucket = self.buckets[self._next]
            self._launch(bucket, [True] * len(bucket.params))
            self._next += 1

    def _launch(self, bucket: _Bucket, needed: list[bool]) -> None:
        """All-reduce `bucket`; a needed gradient this rank lacks enters as zeros."""
        if bucket.buffer is None:
            (param,) = bucket.params
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            flat = param.grad
        else:
            for param, view, need in zip(bucket.params, bucket.views, needed, strict=True):
                if param.grad is None:
                    if need:  # used on another rank only
                        view.zero_()
                        param.grad = view
                elif param.grad.data_ptr() != view.data_ptr():
                    view.copy_(param.grad)  # a fresh gradient (its .grad was None)
                    param.grad = view
            flat = bucket.buffer
        bucket.work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.group,
                                      async_op=True)
        for listener in self.listeners:
            listener(bucket.params, bucket.work)

    def _used_on_any_rank(self) -> list[bool]:
        """Which parameters got a gradient on at least one rank since the last finish()."""
        if not self._used:
            return []
        counts = torch.frombuffer(self._used, dtype=torch.uint8).to(torch.int32)
        dist.all_reduce(counts, group=self._usage_group)
        return (counts > 0).tolist()

    def reduced_params(self) -> list[nn.Parameter]:
        """Every parameter whose gradient a bucket averages."""
        return [param for bucket in self.buckets for param in bucket.params]

    @torch.no_grad()
    def finish(self) -> None:
        """Launch whatever has not been launched and wait for all: `.grad` holds averages.

        A gradient some rank got is averaged on all, as zeros where missing; one no rank
        got stays as it is (None after zero_grad(set_to_none=True)).
        """
        needed = self._used_on_any_rank()
        for bucket in self.buckets[self._next:]:
            bucket_needed = needed[bucket.first:bucket.first + len(bucket.params)]
            if any(bucket_needed):
                self._launch(bucket, bucket_needed)
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
            bucket.reset()
        self._used = bytearray(len(self._used))
        self._synced = bytearray(len(self._synced))
        self._syncing, self._next, self._pending = False, 0, False
        mark_synchronized(self)

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
