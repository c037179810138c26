"""Building blocks of the Transformer: RMSNorm, rotary embeddings, SwiGLU, attention."""

from __future__ import annotations

import math

import torch
from torch import nn

from systems.attention import get_attention
from systems.common.nvtx import nvtx_range


def _init_linear(layer: nn.Linear) -> nn.Linear:
    std = math.sqrt(2.0 / (layer.in_features + layer.out_features))
    nn.init.trunc_normal_(layer.weight, std=std, a=-3 * std, b=3 * std)
    return layer


def linear(d_in: int, d_out: int) -> nn.Linear:
    """A bias-free linear layer with truncated-normal initialisation."""
    return _init_linear(nn.Linear(d_in, d_out, bias=False))


class RMSNorm(nn.Module):
    """y = x / rms(x) * g, computed in fp32 and cast back to the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x32 = x.to(torch.promote_types(in_dtype, torch.float32))
        inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * inv_rms * self.weight).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over pairs (2i, 2i+1) of each head's features."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        # Buffers are not persistent: they are a pure function of the config.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (..., head_dim); positions index the table and broadcast against x's leading
        dims: (seq,) for x (..., seq, head_dim), (seq, 1) for x (batch, seq, heads, head_dim)."""
        cos, sin = self.cos[positions], self.sin[positions]
        x_even, x_odd = x[..., 0::2], x[..., 1::2]
        rotated_even = x_even * cos - x_odd * sin
        rotated_odd = x_even * sin + x_odd * cos
        return torch.stack((rotated_even, rotated_odd), dim=-1).flatten(-2).to(x.dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = linear(d_model, d_ff)
        self.w2 = linear(d_ff, d_model)
        self.w3 = linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with RoPE on queries and keys."""

    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding, attention: str) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = linear(d_model, d_model)
        self.k_proj = linear(d_model, d_model)
        self.v_proj = linear(d_model, d_model)
        self.output_proj = linear(d_model, d_model)
        self.rope = rope
        self.attention_name = attention
        self.attend = get_attention(attention)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, d_model) -> (batch, seq, heads, head_dim), a view."""
        batch, seq, d_model = x.shape
        return x.view(batch, seq, self.num_heads, d_model // self.num_heads)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # q, k and v stay in the projections' (batch, seq, heads, d) layout: RoPE runs there
        # (positions broadcast over heads), and attention gets (batch, heads, seq, d) views.
        # Backends that read strided views (flash_triton, SDPA) then need no transposing
        # copies, and an output laid out like q reshapes back into d_model without one.
        along_seq = positions[:, None]
        q = self.rope(self._split_heads(self.q_proj(x)), along_seq).transpose(1, 2)
        k = self.rope(self._split_heads(self.k_proj(x)), along_seq).transpose(1, 2)
        v = self._split_heads(self.v_proj(x)).transpose(1, 2)
        with nvtx_range("attention"):
            out = self.attend(q, k, v, is_causal=True)
        batch, _, seq, _ = out.shape
        return self.output_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(x))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding,
                 attention: str) -> None:
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads, rope, attention)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), positions)
        return x + self.ffn(self.ln2(x))
