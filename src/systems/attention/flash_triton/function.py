"""The autograd Functions around the kernels."""

from __future__ import annotations

import torch

from systems.attention.autograd import (
    backward_from_saved,
    forward_saving_lse,
    refuse_double_backward,
)
from systems.attention.causal import MASKED_SCORE, causal_mask
from systems.attention.flash_triton.op import attention_backward, attention_forward


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton: `FlashAttentionTriton.apply(q, k, v, is_causal)`.

    q: (..., n_queries, d), k and v: (..., n_keys, d), fp16/bf16/fp32, on a CUDA device (or
    the CPU under TRITON_INTERPRET=1), with any strides: views whose rows are unit-stride
    (such as (batch, seq, heads, d) projections seen as (batch, heads, seq, d)) are read in
    place, others copied; o and the gradients are laid out like q, k and v. Saves L (shape
    (..., n_queries)), q, k, v and o; backward runs the dQ and dK/dV kernels. Eager calls
    launch the kernels directly; under torch.compile they are custom ops (`op.py`). Double
    backward is refused.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                is_causal: bool = False) -> torch.Tensor:
        return forward_saving_lse(ctx, attention_forward, q, k, v, is_causal)

    @staticmethod
    @refuse_double_backward("FlashAttentionTriton")
    def backward(ctx, do: torch.Tensor):
        return backward_from_saved(ctx, attention_backward, do)


def recompute_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward from L in plain PyTorch, materialising the (n_q, n_k) matrices.

    Matmuls run in the input dtype (as the PyTorch reference's do); P and dS in fp32.
    """
    scale = q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-2, -1)).float() * scale
    if is_causal:
        scores = scores.masked_fill(~causal_mask(*scores.shape[-2:], q.device), MASKED_SCORE)
    p = torch.exp(scores - lse[..., None])
    dv = p.to(do.dtype).transpose(-2, -1) @ do
    dp = (do @ v.transpose(-2, -1)).float()
    delta = (o.float() * do.float()).sum(dim=-1, keepdim=True)
    ds = (p * (dp - delta) * scale).to(q.dtype)
    return ds @ k, ds.transpose(-2, -1) @ q, dv


_compiled_recompute_backward = torch.compile(recompute_backward)


class FlashAttentionTritonCompiledBackward(FlashAttentionTriton):
    """The Triton forward with a `torch.compile`d PyTorch backward (O(N^2) memory)."""

    @staticmethod
    @refuse_double_backward("FlashAttentionTritonCompiledBackward")
    def backward(ctx, do: torch.Tensor):
        return backward_from_saved(ctx, _compiled_recompute_backward, do)
