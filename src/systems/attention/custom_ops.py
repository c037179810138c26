"""The one way into the kernels: eager calls launch them, torch.compile sees custom ops.

torch.compile treats a custom op as one opaque call: a compiled block keeps a single graph
around attention, and Dynamo never traces into the launch code (on the CPU it would trace
into Triton's interpreter and fail). An eager call skips the op's dispatch and launches
the same code directly. `FlashAttentionTriton` (functions.py) is the autograd around both;
the ops themselves carry no autograd formula.
"""

from __future__ import annotations

import torch

from systems.attention.flash_triton.launch import (
    check_triton_inputs,
    flash_backward,
    flash_forward,
)
from systems.attention.gluon.backward import gluon_backward
from systems.attention.gluon.forward import gluon_forward

# Defined through torch.library.Library rather than torch.library.custom_op: custom_op
# wraps every call in Python layers (an autograd kernel that redispatches, an aliasing
# check, a Dynamo-disabling wrapper) that cost compiled callers host time per call. These
# ops need none of them: autograd is FlashAttentionTriton's, and the outputs are new tensors.
_LIBRARY = torch.library.Library("systems", "DEF")
_LIBRARY.define("flash_attention_forward(Tensor q, Tensor k, Tensor v, bool is_causal)"
                " -> (Tensor, Tensor)")
_LIBRARY.define("flash_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse,"
                " Tensor do, bool is_causal) -> (Tensor, Tensor, Tensor)")
_LIBRARY.define("flash_attention_forward_gluon(Tensor q, Tensor k, Tensor v, bool is_causal)"
                " -> (Tensor, Tensor)")
_LIBRARY.define("flash_attention_backward_gluon(Tensor q, Tensor k, Tensor v, Tensor o,"
                " Tensor lse, Tensor do, bool is_causal, bool deterministic)"
                " -> (Tensor, Tensor, Tensor)")


def _forward_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    check_triton_inputs(q, k, v)
    return flash_forward(q, k, v, is_causal)


def _forward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _gluon_forward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # The Gluon forward's o is contiguous whatever q's strides.
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _backward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _gluon_backward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                         lse: torch.Tensor, do: torch.Tensor, is_causal: bool,
                         deterministic: bool
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The Gluon backward's gradients are contiguous whatever the inputs' strides.
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# One kernel for every backend: the launch code refuses devices it cannot run on.
_LIBRARY.impl("flash_attention_forward", _forward_kernel, "CompositeExplicitAutograd")
_LIBRARY.impl("flash_attention_backward", flash_backward, "CompositeExplicitAutograd")
_LIBRARY.impl("flash_attention_forward_gluon", gluon_forward, "CompositeExplicitAutograd")
_LIBRARY.impl("flash_attention_backward_gluon", gluon_backward, "CompositeExplicitAutograd")
torch.library.register_fake("systems::flash_attention_forward", _forward_fake, lib=_LIBRARY)
torch.library.register_fake("systems::flash_attention_backward", _backward_fake, lib=_LIBRARY)
torch.library.register_fake("systems::flash_attention_forward_gluon", _gluon_forward_fake,
                            lib=_LIBRARY)
torch.library.register_fake("systems::flash_attention_backward_gluon", _gluon_backward_fake,
                            lib=_LIBRARY)
flash_attention_forward = torch.ops.systems.flash_attention_forward.default
flash_attention_backward = torch.ops.systems.flash_attention_backward.default
flash_attention_forward_gluon = torch.ops.systems.flash_attention_forward_gluon.default
flash_attention_backward_gluon = torch.ops.systems.flash_attention_backward_gluon.default


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) from the forward kernel."""
    if torch.compiler.is_compiling():
        return flash_attention_forward(q, k, v, is_causal)
    check_triton_inputs(q, k, v)
    return flash_forward(q, k, v, is_causal)


def attention_forward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) from the Gluon forward for Hopper (`gluon/forward.py`)."""
    if torch.compiler.is_compiling():
        return flash_attention_forward_gluon(q, k, v, is_causal)
    return gluon_forward(q, k, v, is_causal)


def attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from the dQ and dK/dV kernels."""
    if torch.compiler.is_compiling():
        return flash_attention_backward(q, k, v, o, lse, do, is_causal)
    return flash_backward(q, k, v, o, lse, do, is_causal)


def attention_backward_gluon(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool, deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from the fused Gluon backward for Hopper (`gluon/backward.py`)."""
    if torch.compiler.is_compiling():
        return flash_attention_backward_gluon(q, k, v, o, lse, do, is_causal, deterministic)
    return gluon_backward(q, k, v, o, lse, do, is_causal, deterministic)
