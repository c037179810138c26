"""Fully sharded data parallelism (ZeRO stage 3) for any module tree.

Every 2-D parameter (the weight of a linear- or embedding-like module, whatever its class)
is flattened, padded to a multiple of the world size and split evenly: each rank keeps one
fp32 shard as the trainable parameter, so weights, gradients and optimizer state of those
parameters take 1/world_size of the memory. Other parameters (norm gains, biases) stay
replicated; their gradients are averaged with one all-reduce during backward.

Around each owning module's forward the full weight is all-gathered and then freed. The
autograd graph keeps no full weight alive: a saved-tensor hook replaces a saved view of a
gathered weight by a marker and re-gathers it when backward needs it. The full weight's
gradient is reduce-scattered (summed, then divided by the world size) into the shard.
Gathers run ahead: when module call i starts, the gather for call i+1 is launched, so a
layer's gather starts once the layer two before it has finished; backward does the same
in the order backward asked for the weights in the previous step (the first backward
guesses the reverse of the order the forward saved them in). Orders are recorded in each
step and used in the next, so the first forward gathers on demand.

With `compute_dtype`, shards are cast before the all-gather, the module computes in that
dtype, gradients are reduced in it and accumulated into the fp32 shards: master weights
and optimizer updates stay fp32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from systems.distributed.grad_sync import GradientSynchronizer
from systems.distributed.process_group import (
    all_gather_flat,
    broadcast_module_state,
    reduce_scatter_flat,
)


class _ShardedWeight:
    """One 2-D parameter split over ranks, with its gather buffer and pending reductions."""

    def __init__(self, name: str, param: nn.Parameter, compute_dtype: torch.dtype | None,
                 rank: int, world_size: int) -> None:
        self.name, self.shape, self.numel = name, param.shape, param.numel()
        self.world_size = world_size
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padding = self.shard_numel * world_size - self.numel
        flat = F.pad(param.detach().reshape(-1), (0, self.padding))
        start = rank * self.shard_numel
        self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone(),
                                  requires_grad=param.requires_grad)
        self.comm_dtype = compute_dtype or param.dtype
        self.full_flat: torch.Tensor | None = None  # gathered, padded, in comm_dtype
        self._gather_work: dist.Work | None = None
        self._grad_works: list[tuple[dist.Work, torch.Tensor]] = []

    def start_gather(self) -> None:
        if self.full_flat is not None:
            return
        self.full_flat = torch.empty(self.shard_numel * self.world_size, dtype=self.comm_dtype,
                                     device=self.shard.device)
        local = self.shard.detach().to(self.comm_dtype)
        self._gather_work = all_gather_flat(self.full_flat, local, async_op=True)

    def gathered(self) -> torch.Tensor:
        """The padded full weight, flat, once its all-gather has completed."""
        self.start_gather()
        if self._gather_work is not None:
            self._gather_work.wait()
            self._gather_work = None
        return self.full_flat

    def full_weight(self) -> torch.Tensor:
        return self.gathered()[:self.numel].view(self.shape)

    def release(self) -> None:
        self.full_flat, self._gather_work = None, None

    def reduce_scatter(self, grad: torch.Tensor) -> None:
        flat = F.pad(grad.reshape(-1), (0, self.padding)) if self.padding else grad.reshape(-1)
        out = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
        work = reduce_scatter_flat(out, flat.contiguous(), op=dist.ReduceOp.SUM,
                                          async_op=True)
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


class _GatherWeight(torch.autograd.Function):
    """Shard -> full weight; backward sends the full weight's gradient to reduce-scatter."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, unit: _ShardedWeight) -> torch.Tensor:
        ctx.unit = unit
        return unit.full_weight()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        ctx.unit.reduce_scatter(grad)
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
        self._units: dict[str, _ShardedWeight] = {}
        self._replicated: dict[str, nn.Parameter] = {}
        # (attribute, unit or replicated parameter) that each module installs per call.
        self._owned: dict[nn.Module, list[tuple[str, _ShardedWeight | nn.Parameter]]] = {}
        self._take_parameters()
        self.shards = nn.ParameterList(unit.shard for unit in self._units.values())
        self.replicated = nn.ParameterList(
            self._replicated.values() if compute_dtype is not None else [])
        self.grad_sync = GradientSynchronizer(
            [p for p in self._replicated.values() if p.requires_grad], None, overlap=True)
        for owner in self._owned:
            owner.register_forward_pre_hook(self._before_call)
            owner.register_forward_hook(self._after_call)
        self._by_storage: dict[int, _ShardedWeight] = {}
        self._call_order: list[nn.Module] = []
        self._recording_calls: list[nn.Module] = []
        self._next_in_backward: dict[_ShardedWeight, _ShardedWeight] = {}
        self._recording_saved: list[_ShardedWeight] = []
        self._recording_backward: list[_ShardedWeight] = []

    def _take_parameters(self) -> None:
        """Replace 2-D parameters by shards (and, with compute_dtype, all by casts)."""
        seen: dict[nn.Parameter, _ShardedWeight | nn.Parameter] = {}
        prefixes = {module: prefix for prefix, module in self.module.named_modules()}
        for module, prefix in prefixes.items():
            for attr, param in list(module.named_parameters(recurse=False)):
                name = f"{prefix}.{attr}" if prefix else attr
                if param not in seen:
                    if param.dim() == 2:
                        seen[param] = self._units[name] = _ShardedWeight(
                            name, param, self.compute_dtype, self.rank, self.world_size)
                    else:
                        seen[param] = self._replicated[name] = param
                entry = seen[param]
                if isinstance(entry, _ShardedWeight) or self.compute_dtype is not None:
                    del module._parameters[attr]
                    setattr(module, attr, None)
                    self._owned.setdefault(module, []).append((attr, entry))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._recording_calls, self._recording_saved = [], []
        self._by_storage.clear()
        if self._call_order:
            self._start_gathers(self._call_order[0])
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            output = self.module(*args, **kwargs)
        self._call_order, saved = self._recording_calls, self._recording_saved
        if not self._next_in_backward:  # first step: guess the reverse of the saving order
            self._next_in_backward = dict(zip(saved[1:], saved[:-1], strict=True))
        self._release_all()
        return output

    def _start_gathers(self, module: nn.Module) -> None:
        for _, entry in self._owned[module]:
            if isinstance(entry, _ShardedWeight):
                entry.start_gather()
                self._by_storage[entry.full_flat.untyped_storage().data_ptr()] = entry

    def _before_call(self, module: nn.Module, _args: Any) -> None:
        index = len(self._recording_calls)
        self._recording_calls.append(module)
        self._start_gathers(module)
        if index + 1 < len(self._call_order):  # prefetch the next call's weights
            self._start_gathers(self._call_order[index + 1])
        for attr, entry in self._owned[module]:
            if isinstance(entry, _ShardedWeight):
                setattr(module, attr, _GatherWeight.apply(entry.shard, entry))
            else:
                setattr(module, attr, _cast(entry, self.compute_dtype))

    def _after_call(self, module: nn.Module, _args: Any, _output: Any) -> None:
        for attr, entry in self._owned[module]:
            setattr(module, attr, None)
            if isinstance(entry, _ShardedWeight):
                self._release(entry)

    def _release(self, unit: _ShardedWeight) -> None:
        if unit.full_flat is not None:
            self._by_storage.pop(unit.full_flat.untyped_storage().data_ptr(), None)
        unit.release()

    def _release_all(self) -> None:
        for unit in self._units.values():
            self._release(unit)

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
        for unit in self._units.values():
            unit.finish()
        self.grad_sync.finish()
        self._release_all()
        order, self._recording_backward = self._recording_backward, []
        if order:
            self._next_in_backward = dict(zip(order[:-1], order[1:], strict=True))

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Full fp32 tensors by the unwrapped model's parameter names (a collective)."""
        full: dict[str, torch.Tensor] = {}
        for name in self.param_names:
            if name in self._units:
                unit = self._units[name]
                flat = torch.empty(unit.shard_numel * self.world_size, dtype=unit.shard.dtype,
                                   device=unit.shard.device)
                all_gather_flat(flat, unit.shard.detach())
                full[name] = flat[:unit.numel].view(unit.shape)
            else:
                full[name] = self._replicated[name].detach().clone()
        return full
