"""Checks shared by every attention implementation: what q, k, v and the mask flag must look
like."""

from __future__ import annotations

import torch


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise a ValueError naming the problem unless q: (..., n_queries, d), k, v: (..., n_keys, d).

    The leading dimensions (batch, heads, ...) must match exactly (no broadcasting), and the
    three tensors must share one floating dtype and one device.
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() < 2:
            raise ValueError(f"{name} must have shape (..., seq, d), got {tuple(tensor.shape)}")
        if not tensor.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {tensor.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"leading dims of q {tuple(q.shape[:-2])} and k {tuple(k.shape[:-2])} differ"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"head dims differ: q has {q.shape[-1]}, k and v have {k.shape[-1]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise ValueError(
            f"empty attention: q {tuple(q.shape)}, k {tuple(k.shape)} (need seq, d >= 1)"
        )


def check_is_causal(name: str, is_causal: object) -> None:
    """Raise a TypeError unless is_causal is a bool: a string, None or a tensor would
    otherwise be read as a truth value ("no" as True)."""
    if type(is_causal) is not bool:
        raise TypeError(f"{name}: is_causal must be a bool (True or False), got "
                        f"{type(is_causal).__name__} {is_causal!r}")
