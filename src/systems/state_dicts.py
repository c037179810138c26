"""Small pieces shared by the checkpoint code of the sharded optimizer and FSDP."""

from __future__ import annotations

from typing import Any

import torch


def cpu_copy(value: Any) -> Any:
    """A CPU copy of a tensor (never the tensor itself); other values as they are."""
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


def hyperparameters(param_group: dict[str, Any]) -> dict[str, Any]:
    """An optimizer parameter group without its parameters."""
    return {key: value for key, value in param_group.items() if key != "params"}
