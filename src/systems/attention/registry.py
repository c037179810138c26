"""Attention backends selectable by name."""

from __future__ import annotations

from collections.abc import Callable

import torch

from systems.attention.flash_pytorch import FlashAttentionPytorch
from systems.attention.flash_triton.op import flash_attention_forward
from systems.attention.reference import reference_attention, sdpa_attention

AttentionFn = Callable[..., torch.Tensor]


def flash_pytorch_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    return FlashAttentionPytorch.apply(q, k, v, is_causal)


def flash_triton_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    # The model hands over per-head views of its projections; the kernels want them packed.
    # The custom op (not the autograd Function) so that compiled blocks stay one graph.
    o, _ = flash_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), is_causal)
    return o


# Every backend takes (q, k, v, is_causal=...) with q: (..., n_queries, d).
ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "reference": reference_attention,
    "sdpa": sdpa_attention,
    "flash_pytorch": flash_pytorch_attention,
    "flash_triton": flash_triton_attention,
}


def get_attention(name: str) -> AttentionFn:
    try:
        return ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}"
        ) from None
