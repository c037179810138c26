"""Fixtures the correctness tests share."""

from __future__ import annotations

import math

import pytest
import torch

from systems.attention.flash_triton import launch
from systems.attention.host_path import replay


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Kernel outputs start as NaN, so an element a kernel forgets to write fails the test."""
    def new_nan(like, shape, dtype=None):
        return torch.full(shape, math.nan, dtype=dtype or like.dtype, device=like.device)

    monkeypatch.setattr(launch, "_new_empty", new_nan)
    monkeypatch.setattr(launch, "_empty_like",
                        lambda t, dtype=None: torch.full_like(t, math.nan, dtype=dtype))
    replay.set_poison(True)  # outputs of calls replayed from C++
    yield
    replay.set_poison(False)
