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

Around each call of a unit root its units are all-gathered and afterwards freed; owners
inside the call see their weights as views of the gathered buffer (an owner called outside
its root's call gathers on demand, until the end of the forward). The autograd graph keeps
no gathered weight alive: a saved-tensor hook replaces a saved view of a gathered buffer by
a marker and re-gathers the unit when backward needs it. One autograd node makes all of a
gather's weights; its backward runs once all their gradients are complete, concatenates
them and reduce-scatters (sums, then divides by the world size) into the shard. So within a
unit that gets gradients, a weight that got none receives zeros, where single-process
training leaves its `.grad` None; a weight used only sometimes belongs outside a ModuleList
element, in a unit of its own.

Gathers run ahead: when unit-root call i starts, the gather for call i+1 is launched, so a
block's gather starts once the block two before it has finished; backward does the same in
the order backward asked for the units in the previous step (the first backward guesses
the reverse of the order the forward saved them in). Orders are recorded in each step and
used in the next, so the first forward gathers on demand.

With `compute_dtype`, shards are cast before the all-gather, the module computes in that
dtype, gradients are reduced in it and accumulated into the fp32 shards: master weights
and optimizer updates stay fp32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from systems.distributed.grad_sync import GradientSynchronizer
from systems.distributed.process_group import (
    all_gather_flat,
    broadcast_module_state,
    reduce_scatter_flat,
)


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
        self._gather_work: dist.Work | None = None
        self._grad_works: list[tuple[dist.Work, torch.Tensor]] = []

    def split(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The weights, shaped, as views of a full (gathered) flat buffer of this unit."""
        return tuple(flat[slot.offset:slot.offset + slot.shape.numel()].view(slot.shape)
                     for slot in self.slots)

    def start_gather(self) -> None:
        if self.full_flat is not None:
            return
        self.full_flat = torch.empty(self.shard_numel * self.world_size, dtype=self.comm_dtype,
                                     device=self.shard.device)
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

    def reduce_scatter(self, grads: Sequence[torch.Tensor]) -> None:
        """Sum the full gradients of the unit's weights over ranks into a shard-sized buffer."""
        pieces = [grad.reshape(-1) for grad in grads]
        if self.padding:
            pieces.append(pieces[0].new_zeros(self.padding))
        flat = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        out = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
        work = reduce_scatter_flat(out, flat.contiguous(), op=dist.ReduceOp.SUM, async_op=True)
        self._grad_works.append((work, out))

    def finish(self) -> None:
        """Accumulate this step's reduced gradients into the fp32 shard's .grad."""
        for work, out in self._grad_works:
            work.wait()
            grad = out.to(self.shard.dtype).div_(self.world_size)
            if self.shard.grad is None:
                self.shard.grad = grad
            else:
                self.shard.grad += grad
        self._grad_works.clear()


def _cast(param: nn.Parameter, dtype: torch.dtype) -> torch.Tensor:
    """A differentiable non-Parameter copy-or-view of `param` in `dtype`."""
    return param.view_as(param) if param.dtype == dtype else param.to(dtype)


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
    def forward(ctx: Any, shard: torch.Tensor, unit: _Unit) -> tuple[torch.Tensor, ...]:
        ctx.unit = unit
        return unit.split(unit.gathered())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, None]:
        ctx.unit.reduce_scatter(grads)
        ctx.unit.release()
        return None, None


class FSDP(nn.Module):
    """Shards 2-D weights over the default process group; see the module docstring."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialise the default process group before wrapping a model")
        self.module, self.compute_dtype = module, compute_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        broadcast_module_state(module)
        self.param_names = [name for name, _ in module.named_parameters()]
        self._units: list[_Unit] = []
        self._replicated: dict[str, nn.Parameter] = {}
        # (attribute, (unit, slot index) or replicated parameter) each module installs per call.
        self._owned: dict[nn.Module, list[tuple[str, tuple[_Unit, int] | nn.Parameter]]] = {}
        self._roots: dict[nn.Module, list[_Unit]] = {}  # units gathered around a root's call
        self._take_parameters()
        self.shards = nn.ParameterList(unit.shard for unit in self._units)
        self.replicated = nn.ParameterList(
            self._replicated.values() if compute_dtype is not None else [])
        self.grad_sync = GradientSynchronizer(
            [p for p in self._replicated.values() if p.requires_grad], None, overlap=True)
        for hooked in {**self._roots, **self._owned}:
            hooked.register_forward_pre_hook(self._before_call)
            hooked.register_forward_hook(self._after_call)
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
                units = self._roots.setdefault(_unit_root(module, parents), [])
                if where[param][0] not in units:
                    units.append(where[param][0])
            if param in where or self.compute_dtype is not None:
                del module._parameters[attr]
                setattr(module, attr, None)
                self._owned.setdefault(module, []).append((attr, where.get(param, param)))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._recording_calls, self._recording_saved = [], []
        self._by_storage.clear()
        for unit in self._roots[self._call_order[0]] if self._call_order else []:
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
        """Gather `unit` and make its weights for the calls to come (one autograd node)."""
        self._start_gather(unit)
        self._installed[unit] = _GatherUnit.apply(unit.shard, unit)

    def _before_call(self, module: nn.Module, _args: Any) -> None:
        if module in self._roots:
            index = len(self._recording_calls)
            self._recording_calls.append(module)
            upcoming = self._call_order[index + 1] if index + 1 < len(self._call_order) else None
            for unit in self._roots[module] + self._roots.get(upcoming, []):
                self._start_gather(unit)  # this call's units, then prefetch the next call's
            for unit in self._roots[module]:
                self._open(unit)
        for attr, entry in self._owned.get(module, []):
            if isinstance(entry, tuple):
                unit, slot = entry
                if unit not in self._installed:  # called outside its root's call
                    self._open(unit)
                setattr(module, attr, self._installed[unit][slot])
            else:
                setattr(module, attr, _cast(entry, self.compute_dtype))

    def _after_call(self, module: nn.Module, _args: Any, _output: Any) -> None:
        for attr, _ in self._owned.get(module, []):
            setattr(module, attr, None)
        for unit in self._roots.get(module, []):
            self._installed.pop(unit, None)
            unit.release()

    def _release_all(self) -> None:
        self._installed.clear()
        for unit in self._units:
            unit.release()

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
        following = self._next_in_backward.get(unit)
        if following is not None:  # prefetch what backward needs next
            following.start_gather()
        return full.as_strided(size, stride, offset)

    def finish_gradient_synchronization(self) -> None:
        """Wait for all gradient reductions; call after backward, before optimizer.step()."""
        for unit in self._units:
            unit.finish()
        self.grad_sync.finish()
        self._release_all()
        order, self._recording_backward = self._recording_backward, []
        if order:
            self._next_in_backward = dict(zip(order[:-1], order[1:], strict=True))

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Full fp32 tensors by the unwrapped model's parameter names (a collective)."""
        full = {name: param.detach().clone() for name, param in self._replicated.items()}
        for unit in self._units:
            flat = torch.empty(unit.shard_numel * self.world_size, dtype=unit.shard.dtype,
                               device=unit.shard.device)
            all_gather_flat(flat, unit.shard.detach())
            full.update(zip((slot.name for slot in unit.slots), unit.split(flat), strict=True))
        return {name: full[name] for name in self.param_names}
