"""Rank-side helpers shared by the checkpoint tests."""

from __future__ import annotations

import io

import torch


def through_a_file(state: dict) -> dict:
    """What a checkpoint file gives back: private copies on the CPU (tensors passed to a
    rank share memory with the other ranks, and a loaded optimizer may keep them)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, map_location="cpu")
