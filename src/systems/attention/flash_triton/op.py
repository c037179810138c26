"""The kernels as torch custom ops, for the model's attention backend.

torch.compile treats a custom op as one opaque call: a compiled block keeps a single graph
around attention, and dynamo never traces into the launch code (on the CPU it would trace
into Triton's interpreter and fail). The autograd Function in `function.py` stays the
public API; both run the same kernels.
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


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, is_causal = inputs
    o, lse = output
    ctx.save_for_backward(lse, q, k, v, o)
    ctx.is_causal = is_causal


def _backward(ctx, do: torch.Tensor, _grad_lse: torch.Tensor | None):
    lse, q, k, v, o = ctx.saved_tensors
    return (*flash_attention_backward(q, k, v, o, lse, do, ctx.is_causal), None)


flash_attention_forward.register_autograd(_backward, setup_context=_setup_context)
