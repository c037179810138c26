"""Fully sharded data parallelism (ZeRO stage 3) for any module tree.

Every 2-D parameter (the weight of a linear- or embedding-like module, whatever its class)
is sharded; other parameters (norm gains, biases) stay replicated and their gradients are
averaged with one all-reduce during backward.

Units. Sharded weights are communicated in units: a unit's weights are flattened,
concatenated, padded to a multiple of the world size and split evenly, so each rank keeps
one contiguous fp32 shard of the unit as its trainable parameter (weights, gradients and
optimizer state take 1/world_size of the memory), one all-gather brings all of the unit's
weights and one reduce-scatter reduces all of their gradients. A weight's unit follows from
its owner (the module whose parameter it is) through the owner's unit root: the outermost
ancestor-or-self of the owner that is an element of an nn.ModuleList and no ModuleList
itself (a Transformer block in a stack of blocks), or, without one, the owner itself (an
embedding, an LM head). A root's weights form one unit, or several where they differ in
dtype, device or requires_grad. A tied weight lives in the unit of its first owner.

Around each call of a unit root its units are all-gathered and afterwards freed; while a
unit is gathered, its owners' weight attributes are views of the gathered buffer, set once
per gather (an owner called outside its root's call gathers on demand, until the end of the
forward). The autograd graph keeps no gathered weight alive: a saved-tensor hook replaces a
saved view of a gathered buffer by a marker and re-gathers the unit when backward needs it.
One autograd node makes all of a gather's weights; its backward runs once all their
gradients are complete, concatenates them and reduce-scatters them into the shard, averaged
over ranks (by NCCL in the collective; gloo sums, then the sum is divided). So within a
unit that gets gradients, a weight that got none receives zeros, where single-process
training leaves its `.grad` None; a weight used only sometimes belongs outside a
ModuleList element, in a unit of its own.

Gathers run ahead (`prefetch`, default 1): when unit-root call i starts, the gathers for
calls i+1 .. i+prefetch are launched, so with 1 a block's gather starts once the block two
before it has finished; backward does the same in the order backward asked for the units
in the previous step (the first backward guesses the reverse of the order the forward saved
them in). Orders are recorded in each step and used in the next, so the first forward
gathers on demand; so does every gather with `prefetch=0`. Each further call ahead keeps
one more unit's full weights alive.

Early steps. Each gather's autograd node reduces once, so a unit's gradient is complete
when the reduce-scatter of its last gather in a synchronizing forward launches; then the
listeners of `gradient_reductions()` are told (`BucketSteps` steps the shard from there,
on a side stream, beside the rest of backward). A gather whose backward never runs keeps
its unit from being told: it is stepped after the sync.

With `compute_dtype`, shards are cast before the all-gather, the module computes in that
dtype, gradients are reduced in it and accumulated into the fp32 shards: master weights
and optimizer updates stay fp32.

Accumulation. Backwards of forwards run inside `no_sync()` reduce nothing: each unit adds
its full gradients into a local fp32 buffer (the memory of an unsharded gradient, as in
torch FSDP's no_sync), and replicated parameters add into `.grad`. The first backward of a
forward outside adds the buffer into its gradients before the reduce-scatter, and
`finish_gradient_synchronization()` reduces whatever is left. Outside `no_sync()`, a
second backward before the sync raises once it reaches a replicated parameter's gradient
(grad_sync.SECOND_BACKWARD).

Same collectives. Ranks must run the same sequence of all-gathers and reduce-scatters: a
branch that calls a sharded module on some ranks only would pair collectives of different
sizes, which kills the process inside gloo and hangs or mixes data on NCCL, and a check
at the sync would come too late. So before each of them (and once at the sync) the ranks
all-gather int64s naming the collective over a host gloo group, and raise, all of them,
with what each rank was about to run when they differ. A reduce-scatter is launched once
the next collective (a gather, or the sync) is due, and checked with it in one round trip;
it is launched a moment later, with the same order on every rank. Cost: one host round
trip per unit per forward gather and about one per unit in backward (about two per unit per
step; none at world size 1); it never waits for the device, but holds the ranks' host
threads in step at each check.

Checkpoints. `full_state_dict(optimizer)` gathers the model (full parameters by the
unwrapped model's names, and its persistent buffers) and the optimizer state (each shard's
state split into full tensors per weight, keyed by the same names) to CPU tensors on every
rank; `load_full_state_dict` cuts them into this rank's shards. Units depend on the module
tree, not on the world size, so a checkpoint saved at one world size loads at any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from systems.distributed.grad_sync import (
    SECOND_BACKWARD,
    GradientSynchronizer,
    LocalAccumulation,
    host_group,
    mark_synchronized,
    mark_unsynchronized,
)
from systems.distributed.process_group import (
    all_gather_flat,
    broadcast_module_state,
    reduce_scatter_flat,
)
from systems.state_dicts import cpu_copy, hyperparameters

# The collective checks' all-gather, by a name of its own: counting the weights' gathers
# (as the tests do, by replacing all_gather_flat) leaves the checks out.
_host_all_gather = all_gather_flat


class _Slot(NamedTuple):
    """Where one weight lies in its unit's flat buffer."""

    name: str
    shape: torch.Size
    offset: int


class _Unit:
    """Weights communicated together: a flat shard per rank, the gather buffer, reductions."""

    def __init__(self, weights: list[tuple[str, nn.Parameter]],
                 compute_dtype: torch.dtype | None, rank: int, world_size: int) -> None:
        self.slots: list[_Slot] = []
        numel = 0
        for name, param in weights:
            self.slots.append(_Slot(name, param.shape, numel))
            numel += param.numel()
        self.world_size = world_size
        # NCCL averages inside the reduce-scatter, saving a pass over the shard after it
        # lands (the step waits for that pass); gloo has no average: its sum is divided.
        self.reduce_op = dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM
        self.divide_after = world_size > 1 and self.reduce_op == dist.ReduceOp.SUM
        self.shard_numel = math.ceil(numel / world_size)
        self.padding = self.shard_numel * world_size - numel
        first = weights[0][1]
        flat = torch.cat([p.detach().reshape(-1) for _, p in weights]
                         + [first.new_zeros(self.padding)])
        start = rank * self.shard_numel
        self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone(),
                                  requires_grad=first.requires_grad)
        self.comm_dtype = compute_dtype or first.dtype
        self.full_flat: torch.Tensor | None = None  # gathered, padded, in comm_dtype
        self.local_grad: torch.Tensor | None = None  # no_sync() sums, full, padded, fp32
        # Called before each collective with its kind and this unit's index (_SameCollectives).
        self.agree: Callable[[int, int], None] = lambda kind, index: None
        # Given a reduce-scatter's launch, runs it, checked, before the next collective.
        self.defer: Callable[[int, int, Callable[[], None]], None] = (
            lambda kind, index, launch: launch())
        self.index = 0
        # Told when the last reduce-scatter of the unit's gradients in a step launches
        # (FSDP.gradient_reductions()).
        self.listeners: list[Callable[[list[nn.Parameter], _Unit], None]] = []
        # Gathers of synchronizing forwards whose reduce-scatter has not launched yet: each
        # gather's autograd node reduces once, so the unit's gradient is complete at 0.
        self.sync_gathers = 0
        self._gather_work: dist.Work | None = None
        self._grad_works: list[_ShardGradient] = []

    def gather_full(self, shard_like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """All-gather a tensor laid out like the shard (the shard itself, or optimizer state
        of it): the unit's weights' full tensors, shaped (a collective)."""
        flat = torch.empty(self.shard_numel * self.world_size, dtype=shard_like.dtype,
                           device=shard_like.device)
        all_gather_flat(flat, shard_like.detach().contiguous())
        return self.split(flat)

    def shard_of(self, full: Sequence[torch.Tensor], rank: int) -> torch.Tensor:
        """`rank`'s shard of full tensors shaped like the unit's weights (a new tensor)."""
        flat = torch.cat([tensor.reshape(-1) for tensor in full]
                         + [full[0].new_zeros(self.padding)])
        return flat[rank * self.shard_numel:(rank + 1) * self.shard_numel].clone()

    def split(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The weights, shaped, as views of a full (gathered) flat buffer of this unit."""
        return tuple(flat[slot.offset:slot.offset + slot.shape.numel()].view(slot.shape)
                     for slot in self.slots)

    def start_gather(self) -> None:
        if self.full_flat is not None:
            return
        self.full_flat = torch.empty(self.shard_numel * self.world_size, dtype=self.comm_dtype,
                                     device=self.shard.device)
        self.agree(GATHER, self.index)
        local = self.shard.detach().to(self.comm_dtype)
        self._gather_work = all_gather_flat(self.full_flat, local, async_op=True)

    def gathered(self) -> torch.Tensor:
        """The padded full flat buffer, once its all-gather has completed."""
        self.start_gather()
        if self._gather_work is not None:
            self._gather_work.wait()
            self._gather_work = None
        return self.full_flat

    def release(self) -> None:
        self.full_flat, self._gather_work = None, None

    def reduce_grads(self, grads: Sequence[torch.Tensor], sync: bool) -> None:
        """Sum the full gradients of the unit's weights over ranks into a shard-sized buffer
        (with what no_sync() accumulated), or, without `sync`, add them into local_grad."""
        pieces = [grad.reshape(-1) for grad in grads]
        if self.padding:
            pieces.append(pieces[0].new_zeros(self.padding))
        flat = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if not sync:
            if self.local_grad is None:
                self.local_grad = flat.to(self.shard.dtype, copy=True)
            else:
                self.local_grad += flat
            return
        if self.local_grad is not None:
            flat, self.local_grad = (self.local_grad + flat).to(self.comm_dtype), None
        self._reduce_scatter(flat, of_gather=True)

    def flush(self) -> None:
        """Reduce what no_sync() backwards left with no synchronizing backward after them."""
        if self.local_grad is not None:
            flat, self.local_grad = self.local_grad.to(self.comm_dtype), None
            self._reduce_scatter(flat, of_gather=False)

    def _reduce_scatter(self, flat: torch.Tensor, *, of_gather: bool) -> None:
        self.defer(REDUCE_SCATTER, self.index,
                   lambda: self._launch_reduce_scatter(flat, of_gather))

    def _launch_reduce_scatter(self, flat: torch.Tensor, of_gather: bool) -> None:
        out = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
        work = reduce_scatter_flat(out, flat.contiguous(), op=self.reduce_op, async_op=True)
        self._grad_works.append(_ShardGradient(self, work, out))
        if not of_gather:
            return
        self.sync_gathers -= 1
        if self.sync_gathers < 0 and self.listeners:  # its gradient was already stepped on
            raise RuntimeError(SECOND_BACKWARD)
        if self.sync_gathers == 0:
            for listener in self.listeners:
                listener([self.shard], self)

    def wait(self) -> None:
        """Make the shard's .grad hold this step's reduced gradients (the handle the
        listeners get: on the current stream, as a DDP bucket's work handle)."""
        self.finish()

    def finish(self) -> None:
        """Accumulate this step's reduced gradients into the fp32 shard's .grad."""
        for landing in self._grad_works:
            landing.wait()
        self._grad_works.clear()


class _ShardGradient:
    """One reduce-scatter of a unit's gradients; `wait()` (once, on the current stream)
    adds its average into the shard's .grad."""

    def __init__(self, unit: _Unit, work: dist.Work, out: torch.Tensor) -> None:
        self.unit, self.work, self.out = unit, work, out

    def wait(self) -> None:
        if self.work is None:
            return
        self.work.wait()
        self.work = None
        shard, out = self.unit.shard, self.out
        if out.is_cuda:  # allocated on backward's stream, read on this one
            out.record_stream(torch.cuda.current_stream(out.device))
        grad = out.to(shard.dtype)
        if self.unit.divide_after:
            grad.div_(self.unit.world_size)
        if shard.grad is None:
            shard.grad = grad
        else:
            shard.grad += grad


class _ShardReductions:
    """The units' reduce-scatters as a source of landings: each listener is called with a
    unit's shard and the unit (whose `wait()` completes the shard's gradient) as the last
    reduce-scatter of the unit's gradients in a step launches (`BucketSteps` waits on a
    side stream, then steps the shard)."""

    def __init__(self, units: list[_Unit]) -> None:
        self.units = units
        self.listeners: list[Callable[[list[nn.Parameter], _Unit], None]] = []

    def reduced_params(self) -> list[nn.Parameter]:
        return [unit.shard for unit in self.units if unit.shard.requires_grad]


GATHER, REDUCE_SCATTER, SYNC = range(3)  # the collectives _SameCollectives tells apart
NO_COLLECTIVE = -1  # pads a check that covers fewer collectives than CHECK_WIDTH
# Collectives one round trip checks: in backward, a reduce-scatter and the gather after it.
CHECK_WIDTH = 2


class _SameCollectives:
    """Before each collective, checks that every rank is about to run the same one (see
    the module docstring); raises on every rank, naming what each was about to run.

    A deferred collective is launched after the check of the next one, and checked with
    it: the checks compare the same sequence, in fixed-width pieces that end at the same
    places on ranks whose sequences agree, with fewer round trips.
    """

    def __init__(self, units: list[_Unit]) -> None:
        self.names = [", ".join(slot.name for slot in unit.slots) for unit in units]
        self.group = host_group()
        self.world_size = dist.get_world_size()
        # Reused by every check: a check is a blocking host round trip, so they are free again
        # once it returns.
        self._mine = torch.empty(CHECK_WIDTH, dtype=torch.int64)
        self._everyone = torch.empty(self.world_size * CHECK_WIDTH, dtype=torch.int64)
        self._deferred: list[tuple[int, Callable[[], None]]] = []

    def defer(self, kind: int, index: int, launch: Callable[[], None]) -> None:
        """Run `launch` (the collective) once the next collective has been checked."""
        self._deferred.append((self._tag(kind, index), launch))

    def __call__(self, kind: int, index: int) -> None:
        """Check the deferred collectives and this one, then launch the deferred ones (the
        caller launches this one)."""
        tags = [tag for tag, _ in self._deferred] + [self._tag(kind, index)]
        launches = [launch for _, launch in self._deferred]
        self._deferred.clear()
        for start in range(0, len(tags), CHECK_WIDTH):
            self._check(tags[start:start + CHECK_WIDTH])
        for launch in launches:
            launch()

    def _tag(self, kind: int, index: int) -> int:
        return kind * len(self.names) + index

    def _check(self, tags: list[int]) -> None:
        if self.world_size == 1:  # no other rank to disagree with: skip the round trip
            return
        mine = tags + [NO_COLLECTIVE] * (CHECK_WIDTH - len(tags))
        self._mine.numpy()[:] = mine
        _host_all_gather(self._everyone, self._mine, group=self.group)
        everyone = self._everyone.view(self.world_size, CHECK_WIDTH).tolist()
        if any(theirs != mine for theirs in everyone):
            doing = "; ".join(f"rank {rank}: {self._describe(theirs)}"
                              for rank, theirs in enumerate(everyone))
            raise RuntimeError(
                f"FSDP: the ranks ran different collectives ({doing}). Every rank must call "
                "the sharded modules in the same order: a branch taken on some ranks only "
                "(on the rank or its data) must not add or skip a sharded module's call")

    def _describe(self, tags: list[int]) -> str:
        return " then ".join(self._describe_one(tag) for tag in tags if tag != NO_COLLECTIVE)

    def _describe_one(self, tag: int) -> str:
        kind, index = divmod(tag, len(self.names))
        if kind == SYNC:
            return "finish_gradient_synchronization()"
        what = "all-gather" if kind == GATHER else "reduce-scatter"
        return f"{what} of {self.names[index]}"


def _check_compute_dtype(compute_dtype: Any) -> None:
    if compute_dtype is None:
        return
    if not isinstance(compute_dtype, torch.dtype):
        raise TypeError(f"compute_dtype must be a torch.dtype or None, got {compute_dtype!r}")
    if not compute_dtype.is_floating_point:  # an integer dtype would truncate the weights
        raise ValueError(f"compute_dtype must be a floating-point dtype (e.g. "
                         f"torch.bfloat16), got {compute_dtype}")


def _cast(param: nn.Parameter, dtype: torch.dtype) -> torch.Tensor:
    """A differentiable non-Parameter copy-or-view of `param` in `dtype`."""
    return param.view_as(param) if param.dtype == dtype else param.to(dtype)


def _add_once(items: list[Any], item: Any) -> None:
    if item not in items:
        items.append(item)


def _set_plain_attribute(module: nn.Module, attr: str, value: torch.Tensor | None) -> None:
    """module.attr = value for an attribute that is no parameter, buffer or submodule (as
    the weights taken from _parameters are), without nn.Module.__setattr__'s checks: this
    runs for every weight around every unit's call."""
    object.__setattr__(module, attr, value)


def _unit_root(module: nn.Module, parents: dict[nn.Module, nn.Module]) -> nn.Module:
    """The outermost ancestor-or-self that is a (non-ModuleList) element of a ModuleList."""
    root = node = module
    while node in parents:
        parent = parents[node]
        if isinstance(parent, nn.ModuleList) and not isinstance(node, nn.ModuleList):
            root = node
        node = parent
    return root


class _GatherUnit(torch.autograd.Function):
    """Shard -> the unit's full weights; backward, once all their gradients are complete,
    reduce-scatters them together (a weight that got none arrives as zeros)."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, unit: _Unit, fsdp: FSDP,
                ) -> tuple[torch.Tensor, ...]:
        ctx.unit, ctx.fsdp, ctx.sync = unit, fsdp, not fsdp._accumulating
        if ctx.sync:
            unit.sync_gathers += 1
        return unit.split(unit.gathered())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, None, None]:
        ctx.fsdp._mark_unsynchronized()
        ctx.unit.reduce_grads(grads, ctx.sync)
        ctx.unit.release()
        return None, None, None


class FSDP(LocalAccumulation, nn.Module):
    """Shards 2-D weights over the default process group; see the module docstring."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None, *,
                 prefetch: int = 1) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialise the default process group before wrapping a model")
        _check_compute_dtype(compute_dtype)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 (unit-root calls gathered "
                             f"ahead), got {prefetch!r}")
        self.module, self.compute_dtype, self.prefetch = module, compute_dtype, prefetch
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        broadcast_module_state(module)
        self.param_names = [name for name, _ in module.named_parameters()]
        self._units: list[_Unit] = []
        self._replicated: dict[str, nn.Parameter] = {}
        self._roots: dict[nn.Module, list[_Unit]] = {}  # units gathered around a root's call
        # The owners' attributes (owner, attribute, slot index) that show a unit's weights.
        self._attributes: dict[_Unit, list[tuple[nn.Module, str, int]]] = {}
        # Owners that are no unit root: their units, opened when called outside the root's call.
        self._nested_owners: dict[nn.Module, list[_Unit]] = {}
        # With compute_dtype, replicated parameters are cast around each call of their owner.
        self._casts: dict[nn.Module, list[tuple[str, nn.Parameter]]] = {}
        self._take_parameters()
        self.shards = nn.ParameterList(unit.shard for unit in self._units)
        self._unit_of_shard = {unit.shard: unit for unit in self._units}
        self.replicated = nn.ParameterList(
            self._replicated.values() if compute_dtype is not None else [])
        # Launched at the sync, after the collective check: during backward its all-reduce
        # would interleave unchecked with the reduce-scatters. Replicated parameters are
        # small (biases, norm gains), so there is little to overlap.
        self.grad_sync = GradientSynchronizer(
            [p for p in self._replicated.values() if p.requires_grad], None, overlap=False)
        self._same_collectives = _SameCollectives(self._units)
        self._shard_reductions = _ShardReductions(self._units)
        for index, unit in enumerate(self._units):
            unit.index, unit.agree = index, self._same_collectives
            unit.defer = self._same_collectives.defer
            unit.listeners = self._shard_reductions.listeners
        self._shard_ids = frozenset(id(unit.shard) for unit in self._units)
        self._pending = False  # a unit got gradients since the last sync
        self._register_hooks()
        self._installed: dict[_Unit, tuple[torch.Tensor, ...]] = {}  # weights of open gathers
        self._by_storage: dict[int, _Unit] = {}
        self._call_order: list[nn.Module] = []
        self._recording_calls: list[nn.Module] = []
        self._next_in_backward: dict[_Unit, _Unit] = {}
        self._recording_saved: list[_Unit] = []
        self._recording_backward: list[_Unit] = []

    def _take_parameters(self) -> None:
        """Group 2-D parameters into units and replace them by shards (and, with
        compute_dtype, all parameters by casts)."""
        parents: dict[nn.Module, nn.Module] = {}
        for parent in self.module.modules():
            for child in parent.children():
                parents.setdefault(child, parent)
        owners = [(module, attr, param, f"{prefix}.{attr}" if prefix else attr)
                  for prefix, module in self.module.named_modules()
                  for attr, param in module.named_parameters(recurse=False)]
        groups: dict[tuple[Any, ...], list[tuple[str, nn.Parameter]]] = {}
        seen: set[nn.Parameter] = set()
        for module, _, param, name in owners:
            if param in seen:  # a tied parameter: it lives where it was first found
                continue
            seen.add(param)
            if param.dim() == 2:
                key = (_unit_root(module, parents), param.dtype, param.device,
                       param.requires_grad)
                groups.setdefault(key, []).append((name, param))
            else:
                self._replicated[name] = param
        where: dict[nn.Parameter, tuple[_Unit, int]] = {}
        for weights in groups.values():
            self._units.append(_Unit(weights, self.compute_dtype, self.rank, self.world_size))
            for index, (_, param) in enumerate(weights):
                where[param] = (self._units[-1], index)
        for module, attr, param, _ in owners:
            if param in where:
                unit, slot = where[param]
                root = _unit_root(module, parents)
                _add_once(self._roots.setdefault(root, []), unit)
                if root is not module:
                    _add_once(self._nested_owners.setdefault(module, []), unit)
                self._attributes.setdefault(unit, []).append((module, attr, slot))
            elif self.compute_dtype is not None:
                self._casts.setdefault(module, []).append((attr, param))
            if param in where or self.compute_dtype is not None:
                del module._parameters[attr]
                setattr(module, attr, None)

    def _register_hooks(self) -> None:
        for root in self._roots:
            root.register_forward_pre_hook(self._before_root_call)
            root.register_forward_hook(self._after_root_call)
        for owner in self._nested_owners:
            owner.register_forward_pre_hook(self._before_nested_owner_call)
        for owner in self._casts:
            owner.register_forward_pre_hook(self._install_casts)
            owner.register_forward_hook(self._remove_casts)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # As in DDP, whether a backward synchronizes is decided by its forward.
        self.grad_sync.require_sync = not self._accumulating
        self._recording_calls, self._recording_saved = [], []
        self._by_storage.clear()
        for unit in self._roots[self._call_order[0]] if self._call_order and self.prefetch else []:
            self._start_gather(unit)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            output = self.module(*args, **kwargs)
        self._call_order, saved = self._recording_calls, self._recording_saved
        if not self._next_in_backward:  # first step: guess the reverse of the saving order
            self._next_in_backward = dict(zip(saved[1:], saved[:-1], strict=True))
        self._release_all()
        return output

    def _start_gather(self, unit: _Unit) -> None:
        unit.start_gather()
        self._by_storage[unit.full_flat.untyped_storage().data_ptr()] = unit

    def _open(self, unit: _Unit) -> None:
        """Gather `unit` and make its weights (one autograd node) its owners' attributes
        for the calls to come."""
        self._start_gather(unit)
        weights = self._installed[unit] = _GatherUnit.apply(unit.shard, unit, self)
        for owner, attr, slot in self._attributes[unit]:
            _set_plain_attribute(owner, attr, weights[slot])

    def _close(self, unit: _Unit) -> None:
        """Take `unit`'s weights from its owners (so nothing keeps them alive) and free it."""
        if self._installed.pop(unit, None) is not None:
            for owner, attr, _ in self._attributes[unit]:
                _set_plain_attribute(owner, attr, None)
        unit.release()

    def _before_root_call(self, module: nn.Module, _args: Any) -> None:
        index = len(self._recording_calls)
        self._recording_calls.append(module)
        upcoming = self._call_order[index + 1:index + 1 + self.prefetch]
        ahead = [unit for call in upcoming for unit in self._roots.get(call, [])]
        for unit in self._roots[module] + ahead:
            self._start_gather(unit)  # this call's units, then prefetch the next calls'
        for unit in self._roots[module]:
            self._open(unit)

    def _after_root_call(self, module: nn.Module, _args: Any, _output: Any) -> None:
        for unit in self._roots[module]:
            self._close(unit)

    def _before_nested_owner_call(self, module: nn.Module, _args: Any) -> None:
        for unit in self._nested_owners[module]:
            if unit not in self._installed:  # called outside its root's call
                self._open(unit)

    def _install_casts(self, module: nn.Module, _args: Any) -> None:
        for attr, param in self._casts[module]:
            _set_plain_attribute(module, attr, _cast(param, self.compute_dtype))

    def _remove_casts(self, module: nn.Module, _args: Any, _output: Any) -> None:
        for attr, _ in self._casts[module]:
            _set_plain_attribute(module, attr, None)

    def _release_all(self) -> None:
        for unit in self._units:
            self._close(unit)

    def _pack(self, tensor: torch.Tensor) -> Any:
        ptr = tensor.untyped_storage().data_ptr()
        unit = self._by_storage.get(ptr)
        # The address must still be the unit's current buffer: a freed one may be reused.
        if unit is None or unit.full_flat is None or unit.full_flat.data_ptr() != ptr:
            return tensor
        if not self._recording_saved or self._recording_saved[-1] is not unit:
            self._recording_saved.append(unit)
        return unit, tensor.size(), tensor.stride(), tensor.storage_offset()

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        unit, size, stride, offset = packed
        if not self._recording_backward or self._recording_backward[-1] is not unit:
            self._recording_backward.append(unit)
        full = unit.gathered()
        following = unit
        for _ in range(self.prefetch):  # prefetch what backward needs next
            following = self._next_in_backward.get(following)
            if following is None:
                break
            following.start_gather()
        return full.as_strided(size, stride, offset)

    def _mark_unsynchronized(self) -> None:
        if not self._pending:
            self._pending = True
            mark_unsynchronized(self, self._shard_ids)

    def gradient_reductions(self) -> tuple[_ShardReductions, GradientSynchronizer]:
        """The shards' reduce-scatters and the replicated parameters' all-reduces, each
        telling its listeners of every reduction it launches (`BucketSteps`)."""
        return self._shard_reductions, self.grad_sync

    def finish_gradient_synchronization(self) -> None:
        """Wait for all gradient reductions; call after backward, before optimizer.step()."""
        for unit in self._units:
            unit.flush()
        self._same_collectives(SYNC, 0)
        for unit in self._units:
            unit.finish()
            unit.sync_gathers = 0  # gathers whose backward never ran (no gradient reached)
        self.grad_sync.finish()
        self._pending = False
        mark_synchronized(self)
        self._release_all()
        order, self._recording_backward = self._recording_backward, []
        if order:
            self._next_in_backward = dict(zip(order[:-1], order[1:], strict=True))

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Full fp32 tensors by the unwrapped model's parameter names (a collective)."""
        full = {name: param.detach().clone() for name, param in self._replicated.items()}
        for unit in self._units:
            full.update(zip(self._names(unit.shard), unit.gather_full(unit.shard), strict=True))
        return {name: full[name] for name in self.param_names}

    def _names(self, param: nn.Parameter) -> list[str]:
        """The unwrapped model's names of the weights `param` (a shard, or a replicated
        parameter) holds."""
        unit = self._unit_of_shard.get(param)
        if unit is not None:
            return [slot.name for slot in unit.slots]
        for name, replicated in self._replicated.items():
            if replicated is param:
                return [name]
        raise ValueError("the optimizer holds a parameter that is not one of this FSDP's "
                         "(build it from fsdp.parameters())")

    def _persistent_buffers(self) -> dict[str, torch.Tensor]:
        return {name: tensor for name, tensor in self.module.state_dict(keep_vars=True).items()
                if name not in self._replicated}

    @torch.no_grad()
    def full_state_dict(self, optimizer: torch.optim.Optimizer | None = None,
                        ) -> dict[str, Any]:
        """{"model": full parameters and persistent buffers by the unwrapped model's names,
        "optimizer" (with `optimizer`): its state in torch's format with parameter names in
        place of indices}, as CPU copies on every rank (a collective). Loads at any world
        size with load_full_state_dict."""
        model = {name: cpu_copy(tensor) for name, tensor in self.gather_full_params().items()}
        model.update({name: cpu_copy(b) for name, b in self._persistent_buffers().items()})
        if optimizer is None:
            return {"model": model}
        return {"model": model, "optimizer": self._full_optimizer_state(optimizer)}

    def _full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        saved = optimizer.state_dict()
        if "state" not in saved:
            raise TypeError(f"{type(optimizer).__name__}.state_dict() does not hold every "
                            "parameter's state (a ShardedOptimizer's holds one rank's)")
        state: dict[str, dict[str, Any]] = {}
        groups = []
        for group, saved_group in zip(optimizer.param_groups, saved["param_groups"],
                                      strict=True):
            names = []
            for param, index in zip(group["params"], saved_group["params"], strict=True):
                names += self._names(param)
                if index in saved["state"]:
                    state.update(self._full_param_state(param, saved["state"][index]))
            groups.append({**hyperparameters(saved_group), "params": names})
        return {"state": state, "param_groups": groups}

    def _full_param_state(self, param: nn.Parameter, param_state: dict[str, Any],
                          ) -> dict[str, dict[str, Any]]:
        """Per weight name: state laid out like a shard is gathered and split into the
        weights' full tensors; other state (a step count) is the same for each weight."""
        names = self._names(param)
        unit = self._unit_of_shard.get(param)
        full: dict[str, dict[str, Any]] = {name: {} for name in names}
        for key, value in sorted(param_state.items()):  # the same gathers on every rank
            if unit is not None and isinstance(value, torch.Tensor) and value.shape == param.shape:
                pieces: Sequence[Any] = unit.gather_full(value)
            else:
                pieces = [value] * len(names)
            for name, piece in zip(names, pieces, strict=True):
                full[name][key] = cpu_copy(piece)
        return full

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, Any],
                             optimizer: torch.optim.Optimizer | None = None) -> None:
        """Load a full_state_dict() saved at any world size; each rank keeps its shards.
        Checks everything before changing anything: a mismatch raises ValueError."""
        self._check_model_state(state["model"])
        optimizer_state = (self._sharded_optimizer_state(state["optimizer"], optimizer)
                           if optimizer is not None else None)
        model = state["model"]
        for unit in self._units:
            unit.shard.copy_(unit.shard_of([model[slot.name] for slot in unit.slots], self.rank))
        for name, tensor in {**self._replicated, **self._persistent_buffers()}.items():
            tensor.copy_(model[name])
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)

    def _check_model_state(self, model: dict[str, torch.Tensor]) -> None:
        shapes = {slot.name: slot.shape for unit in self._units for slot in unit.slots}
        shapes.update({name: tensor.shape for name, tensor
                       in {**self._replicated, **self._persistent_buffers()}.items()})
        missing, unexpected = shapes.keys() - model.keys(), model.keys() - shapes.keys()
        if missing or unexpected:
            raise ValueError(f"the model state does not match this model: missing "
                             f"{sorted(missing)}, unexpected {sorted(unexpected)}")
        wrong = [f"{name} {tuple(model[name].shape)} (here {tuple(shape)})"
                 for name, shape in shapes.items() if model[name].shape != shape]
        if wrong:
            raise ValueError(f"the model state has other shapes: {', '.join(wrong)}")

    def _sharded_optimizer_state(self, full: dict[str, Any], optimizer: torch.optim.Optimizer,
                                 ) -> dict[str, Any]:
        """This rank's part of a full optimizer state, in torch's format for `optimizer`."""
        here = [[name for param in group["params"] for name in self._names(param)]
                for group in optimizer.param_groups]
        if [group["params"] for group in full["param_groups"]] != here:
            raise ValueError("the optimizer state's param_groups hold other parameters than "
                             f"this optimizer's: {[g['params'] for g in full['param_groups']]}, "
                             f"here {here}")
        state, groups, index = {}, [], 0
        for group, saved_group in zip(optimizer.param_groups, full["param_groups"], strict=True):
            indices = []
            for param in group["params"]:
                names = self._names(param)
                present = [name in full["state"] for name in names]
                if all(present):
                    state[index] = self._shard_param_state(
                        param, [full["state"][name] for name in names])
                elif any(present):
                    raise ValueError(f"the optimizer state covers some of {names}, not all: "
                                     "they share one shard")
                indices.append(index)
                index += 1
            groups.append({**hyperparameters(saved_group), "params": indices})
        return {"state": state, "param_groups": groups}

    def _shard_param_state(self, param: nn.Parameter, states: list[dict[str, Any]],
                           ) -> dict[str, Any]:
        """The state of `param` from its weights' full states (the inverse of
        _full_param_state)."""
        unit = self._unit_of_shard.get(param)
        if unit is None:
            return dict(states[0])
        names = self._names(param)
        if any(s.keys() != states[0].keys() for s in states):
            raise ValueError(f"the optimizer states of {names} have different keys: they "
                             "share one shard")
        shard_state = {}
        for key in states[0]:
            values = [s[key] for s in states]
            if all(isinstance(v, torch.Tensor) and v.shape == slot.shape
                   for v, slot in zip(values, unit.slots, strict=True)):
                shard_state[key] = unit.shard_of(values, self.rank)
            elif all(_equal(v, values[0]) for v in values):
                shard_state[key] = values[0]
            else:
                raise ValueError(f"optimizer state {key!r} of {names} is neither shaped like "
                                 "each weight nor the same for all: they share one shard")
        return shard_state


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    return a == b
