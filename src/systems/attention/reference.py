"""Attention computed the plain way, and PyTorch's fused SDPA."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from systems.attention.shared.causal import causal_mask
from systems.common.nvtx import nvtx_range


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, materialising the full score matrix.

    q: (..., n_queries, d); k, v: (..., n_keys, d). With `is_causal`, query i attends to
    keys 0..i (`systems.attention.shared.causal`).
    """
    with nvtx_range("attention_scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if is_causal:
            mask = causal_mask(*scores.shape[-2:], q.device)
            scores = scores.masked_fill(~mask, float("-inf"))
    with nvtx_range("attention_softmax"):
        probs = torch.softmax(scores, dim=-1)
    with nvtx_range("attention_final_matmul"):
        return probs @ v


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """PyTorch's scaled_dot_product_attention (picks flash / cuDNN / math itself)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
