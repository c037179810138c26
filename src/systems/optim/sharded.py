"""Optimizer-state sharding (ZeRO stage 1): each rank owns the state of a part of the params.

Every parameter is assigned to one rank, greedily to the least-loaded rank by element
count (largest parameters first), so per-rank optimizer state is about 1/world_size of the
total. A step updates only the local parameters with the wrapped optimizer, then every
parameter is broadcast from its owner so all ranks hold the same values again.

Checkpoints come in two forms, both indexing parameters as torch does (by position across
`param_groups`), so each parameter's state is the same tensors wherever it lives:
- `state_dict()`: this rank's shard, no communication. It loads back only at the same world
  size, on the same rank, into the same parameter groups.
- `consolidated_state_dict(to_rank)`: every parameter's state in torch's format (a
  collective). It loads into a plain optimizer of the wrapped class, or into a
  ShardedOptimizer at any world size, where each rank keeps the state of its own parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from systems.state_dicts import cpu_copy, hyperparameters


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
            local_group.update(hyperparameters(group))
        loss = self.local_optimizer.step(closure)
        self._synchronize_parameters()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: {"shard": {"rank", "world_size", "owners", "state"},
        "param_groups"}. Its tensors are the live state, as torch's state_dict returns."""
        return {"shard": {"rank": self.rank, "world_size": self.world_size,
                          "owners": [self.owner[p] for p in self._params()],
                          "state": self._local_state()},
                "param_groups": self._group_entries()}

    def consolidated_state_dict(self, to_rank: int | None = 0) -> dict[str, Any] | None:
        """The full optimizer state in torch's format, as CPU copies: on rank `to_rank` (None
        elsewhere), or on every rank with `to_rank=None`. A collective: call it on all ranks."""
        shard = {index: {key: cpu_copy(value) for key, value in state.items()}
                 for index, state in self._local_state().items()}
        if to_rank is None:
            shards: list[Any] = [None] * self.world_size
            dist.all_gather_object(shards, shard)
        else:
            shards = [None] * self.world_size if self.rank == to_rank else None
            dist.gather_object(shard, shards, dst=to_rank)
            if shards is None:
                return None
        state = {index: value for shard in shards for index, value in shard.items()}
        return {"state": dict(sorted(state.items())), "param_groups": self._group_entries()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from `state_dict()` (same world size and rank) or a full one (from
        `consolidated_state_dict()` or a plain optimizer of the wrapped class)."""
        saved_groups = state_dict["param_groups"]
        params = self._params()
        if [len(g["params"]) for g in saved_groups] != [len(g["params"])
                                                        for g in self.param_groups]:
            raise ValueError(
                "the state dict does not match this optimizer's parameters: parameters per "
                f"group {[len(g['params']) for g in saved_groups]}, here "
                f"{[len(g['params']) for g in self.param_groups]}")
        param_at = dict(zip((i for g in saved_groups for i in g["params"]), params,
                            strict=True))
        if "shard" in state_dict:
            self._check_shard(state_dict["shard"])
            saved_state = state_dict["shard"]["state"]
        else:
            saved_state = state_dict["state"]
        unknown = set(saved_state) - set(param_at)
        if unknown:
            raise ValueError(f"the state dict has state for unknown parameters {sorted(unknown)}")
        local_params = [p for g in self.local_optimizer.param_groups for p in g["params"]]
        local_index = {p: i for i, p in enumerate(local_params)}
        local_state = {local_index[param_at[i]]: value for i, value in saved_state.items()
                       if self.owner[param_at[i]] == self.rank}
        local_groups = [{**hyperparameters(saved),
                         "params": [local_index[p] for p in local_group["params"]]}
                        for local_group, saved in zip(self.local_optimizer.param_groups,
                                                      saved_groups, strict=True)]
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            group.update(hyperparameters(saved))

    def _check_shard(self, shard: dict[str, Any]) -> None:
        if shard["world_size"] != self.world_size:
            raise ValueError(
                f"this is one rank's shard of a world size {shard['world_size']} run; at world "
                f"size {self.world_size} load a consolidated_state_dict() instead")
        if shard["rank"] != self.rank:
            raise ValueError(f"the state dict holds rank {shard['rank']}'s shard, not rank "
                             f"{self.rank}'s: load each rank's own")
        if shard["owners"] != [self.owner[p] for p in self._params()]:
            raise ValueError("the shard assigns parameters to other ranks than this optimizer: "
                             "its parameters differ in order or size")

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _group_entries(self) -> list[dict[str, Any]]:
        """Each group's hyperparameters (the wrapped optimizer's defaults included, updated by
        ours) with its parameters as indices in torch's numbering."""
        entries, start = [], 0
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups,
                                      strict=True):
            hyper = hyperparameters({**local_group, **group})
            entries.append({**hyper, "params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        return entries

    def _local_state(self) -> dict[int, dict[str, Any]]:
        """The local optimizer's state, keyed by the global index of each parameter."""
        local = self.local_optimizer.state_dict()
        global_index = {p: i for i, p in enumerate(self._params())}
        index_of_local = {
            local_i: global_index[p]
            for group, saved in zip(self.local_optimizer.param_groups, local["param_groups"],
                                    strict=True)
            for p, local_i in zip(group["params"], saved["params"], strict=True)}
        return {index_of_local[i]: state for i, state in local["state"].items()}

    def _synchronize_parameters(self) -> None:
        works = [dist.broadcast(param.data, src=self.owner[param], async_op=True)
                 for param in self._params()]
        for work in works:
            work.wait()
