"""Optimizer-state sharding (ZeRO stage 1): each rank owns the state of a part of the params.

Every parameter is assigned to one rank, greedily to the least-loaded rank by element
count (largest parameters first), so per-rank optimizer state is about 1/world_size of the
total. A step updates only the local parameters with the wrapped optimizer, then every
parameter is broadcast from its owner so all ranks hold the same values again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls(local_params, **optimizer_kwargs)`; a torch.optim.Optimizer."""

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
                 optimizer_cls: type[torch.optim.Optimizer], **optimizer_kwargs: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError("initialise the default process group before ShardedOptimizer")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._optimizer_cls, self._optimizer_kwargs = optimizer_cls, optimizer_kwargs
        self._local: torch.optim.Optimizer | None = None
        self._load = [0] * self.world_size  # elements owned per rank
        self.owner: dict[torch.Tensor, int] = {}
        # The base class calls add_param_group for each group, which builds the local shard.
        super().__init__(params, defaults=optimizer_kwargs)

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        assert self._local is not None
        return self._local

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for param in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
            owner = min(range(self.world_size), key=self._load.__getitem__)
            self.owner[param] = owner
            self._load[owner] += param.numel()
        local_group = {**group, "params": [p for p in group["params"]
                                           if self.owner[p] == self.rank]}
        if self._local is None:
            self._local = self._optimizer_cls([local_group], **self._optimizer_kwargs)
        else:
            self._local.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - signature fixed by torch.optim.Optimizer
        # Hyperparameters set on our groups (e.g. by an LR scheduler) apply to the shard.
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups,
                                      strict=True):
            local_group.update({k: v for k, v in group.items() if k != "params"})
        loss = self.local_optimizer.step(closure)
        self._synchronize_parameters()
        return loss

    def _synchronize_parameters(self) -> None:
        works = [dist.broadcast(param.data, src=self.owner[param], async_op=True)
                 for group in self.param_groups for param in group["params"]]
        for work in works:
            work.wait()
