"""The one way into the kernels: eager calls launch them, torch.compile sees custom ops.

torch.compile treats a custom op as one opaque call: a compiled block keeps a single graph
around attention, and Dynamo never traces into the launch code (on the CPU it would trace
into Triton's interpreter and fail). An eager call skips the op's dispatch and launches
the same code directly. `FlashAttentionTriton` (function.py) is the autograd around both;
the ops themselves carry no autograd formula.
"""

from __future__ import annotations

import torch

from systems.attention.flash_triton.launch import (
    check_triton_inputs,
    flash_backward,
    flash_forward,
)


@torch.library.custom_op("systems::flash_attention_forward", mutates_args=())
def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    check_triton_inputs(q, k, v)
    return flash_forward(q, k, v, is_causal)


@flash_attention_forward.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
      is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("systems::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_backward(q, k, v, o, lse, do, is_causal)


@flash_attention_backward.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
      do: torch.Tensor, is_causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) from the forward kernel."""
    if torch.compiler.is_compiling():
        return flash_attention_forward(q, k, v, is_causal)
    check_triton_inputs(q, k, v)
    return flash_forward(q, k, v, is_causal)


def attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from the dQ and dK/dV kernels."""
    if torch.compiler.is_compiling():
        return flash_attention_backward(q, k, v, o, lse, do, is_causal)
    return flash_backward(q, k, v, o, lse, do, is_causal)
