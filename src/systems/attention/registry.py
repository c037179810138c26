"""Attention backends selectable by name."""

from __future__ import annotations

from collections.abc import Callable

import torch

from systems.attention.reference import reference_attention, sdpa_attention

AttentionFn = Callable[..., torch.Tensor]

# Every backend takes (q, k, v, is_causal=...) with q: (..., n_queries, d).
ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "reference": reference_attention,
    "sdpa": sdpa_attention,
}


def get_attention(name: str) -> AttentionFn:
    try:
        return ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}"
        ) from None
