"""Measure what autograd saves for backward, to check the analytic activation model."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def saved_tensor_bytes(run: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of distinct storages that `run()` saves for backward, minus `exclude`'s (e.g.
    the parameters, which exist anyway). Views of one storage count once."""
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(saved.values())
