"""FlashAttention-2 written tile by tile in PyTorch: the readable reference for the kernels.

Forward: for each query tile, stream over key tiles keeping a running row maximum `m`, a
running softmax denominator `l` and an unnormalised output `acc` (online softmax); only the
log-sum-exp `L = m + log(l)` is kept for backward, never the score matrix.
Backward: recompute each score tile from q, k and L, with D = rowsum(o * do) standing in for
rowsum(P * dP) (Dao, 2023, Algorithm 2). Key tiles form the outer loop, as in the dK/dV pass
of the Triton kernels.
"""

from __future__ import annotations

import math

import torch

from systems.attention.shared.autograd import (
    backward_from_saved,
    forward_saving_lse,
    refuse_double_backward,
)
from systems.attention.shared.causal import MASKED_SCORE, causal_mask
from systems.attention.shared.inputs import check_attention_inputs, check_is_causal

DEFAULT_TILE = 64
MIN_TILE = 16


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Accumulate in fp32 for half types (as the kernels do), in fp64 for fp64 inputs.
    return torch.promote_types(dtype, torch.float32)


def _scores(q_tile: torch.Tensor, k_tile: torch.Tensor, scale: float, is_causal: bool,
            q_start: int, k_start: int) -> torch.Tensor:
    scores = q_tile @ k_tile.transpose(-2, -1) * scale
    if is_causal:
        keep = causal_mask(q_tile.shape[-2], k_tile.shape[-2], q_tile.device, q_start, k_start)
        scores = scores.masked_fill(~keep, MASKED_SCORE)
    return scores


def _key_end(q_start: int, tile_q: int, n_keys: int, is_causal: bool) -> int:
    """One past the last key any query of the tile may see."""
    return min(n_keys, q_start + tile_q) if is_causal else n_keys


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
    tile_q: int = DEFAULT_TILE, tile_k: int = DEFAULT_TILE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L): the attention output and the natural-log log-sum-exp of each query's scores."""
    if min(tile_q, tile_k) < MIN_TILE:
        raise ValueError(f"tiles must be at least {MIN_TILE}x{MIN_TILE}, got {tile_q}x{tile_k}")
    n_queries, n_keys, d = q.shape[-2], k.shape[-2], q.shape[-1]
    compute = _compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=compute, device=q.device)
    for q_start in range(0, n_queries, tile_q):
        q_tile = q[..., q_start:q_start + tile_q, :].to(compute)
        rows = q_tile.shape[-2]
        m = torch.full((*q.shape[:-2], rows), -math.inf, dtype=compute, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741 (the paper's name)
        acc = torch.zeros_like(q_tile)
        for k_start in range(0, _key_end(q_start, tile_q, n_keys, is_causal), tile_k):
            k_tile = k[..., k_start:k_start + tile_k, :].to(compute)
            v_tile = v[..., k_start:k_start + tile_k, :].to(compute)
            s = _scores(q_tile, k_tile, scale, is_causal, q_start, k_start)
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            correction = torch.exp(m - m_new)  # rescales what earlier tiles accumulated
            l = correction * l + p.sum(dim=-1)  # noqa: E741
            acc = correction[..., None] * acc + p @ v_tile
            m = m_new
        o[..., q_start:q_start + rows, :] = (acc / l[..., None]).to(q.dtype)
        lse[..., q_start:q_start + rows] = m + torch.log(l)
    return o, lse


def flash_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool = False,
    tile_q: int = DEFAULT_TILE, tile_k: int = DEFAULT_TILE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) by recomputing P = exp(S - L) one tile at a time."""
    n_queries, n_keys, d = q.shape[-2], k.shape[-2], q.shape[-1]
    compute = _compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    delta = (o.to(compute) * do.to(compute)).sum(dim=-1)  # D = rowsum(o * do) = rowsum(P * dP)
    dq = torch.zeros_like(q, dtype=compute)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    for k_start in range(0, n_keys, tile_k):
        k_tile = k[..., k_start:k_start + tile_k, :].to(compute)
        v_tile = v[..., k_start:k_start + tile_k, :].to(compute)
        dk_tile = torch.zeros_like(k_tile)
        dv_tile = torch.zeros_like(v_tile)
        # Under the causal mask, queries before this key tile see none of it.
        first_q = (k_start // tile_q) * tile_q if is_causal else 0
        for q_start in range(first_q, n_queries, tile_q):
            rows = slice(q_start, q_start + tile_q)
            q_tile = q[..., rows, :].to(compute)
            do_tile = do[..., rows, :].to(compute)
            s = _scores(q_tile, k_tile, scale, is_causal, q_start, k_start)
            p = torch.exp(s - lse[..., rows, None])
            dv_tile += p.transpose(-2, -1) @ do_tile
            dp = do_tile @ v_tile.transpose(-2, -1)
            ds = p * (dp - delta[..., rows, None])
            dq[..., rows, :] += ds @ k_tile * scale
            dk_tile += ds.transpose(-2, -1) @ q_tile * scale
        dk[..., k_start:k_start + tile_k, :] = dk_tile
        dv[..., k_start:k_start + tile_k, :] = dv_tile
    return dq.to(q.dtype), dk, dv


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2 in plain PyTorch: `FlashAttentionPytorch.apply(q, k, v, is_causal)`.

    Saves L (shape (..., n_queries)), q, k, v and o for backward; nothing of size N^2.
    Double backward is refused (`refuse_double_backward`).
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                is_causal: bool = False) -> torch.Tensor:
        check_is_causal("FlashAttentionPytorch", is_causal)
        check_attention_inputs(q, k, v)
        return forward_saving_lse(ctx, flash_forward, q, k, v, is_causal)

    @staticmethod
    @refuse_double_backward("FlashAttentionPytorch")
    def backward(ctx, do: torch.Tensor):
        return backward_from_saved(ctx, flash_backward, do)
