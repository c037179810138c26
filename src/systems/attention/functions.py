"""The autograd Functions around the kernels."""

from __future__ import annotations

import functools

import torch

from systems.attention import dispatch
from systems.attention.custom_ops import (
    attention_backward,
    attention_backward_gluon,
    attention_forward,
    attention_forward_gluon,
)
from systems.attention.dispatch import GLUON, GLUON_ORDERED, GLUON_UNORDERED, TRITON, TWO_PASS
from systems.attention.gluon.backward import unsupported_reason as gluon_unsupported_reason
from systems.attention.host_path import replay
from systems.attention.shared.autograd import (
    backward_from_saved,
    double_backward_refusal,
    first_derivatives_only,
    forward_saving_lse,
    refuse_double_backward,
)
from systems.attention.shared.causal import MASKED_SCORE, causal_mask
from systems.attention.shared.inputs import check_is_causal


class FlashAttentionTritonFunction(torch.autograd.Function):
    """The autograd of FlashAttentionTriton's calls that replay does not serve whole (see
    FlashAttentionTriton), and of every call under torch.compile."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                is_causal: bool = False) -> torch.Tensor:
        return forward_saving_lse(ctx, attention_forward, q, k, v, is_causal)

    @staticmethod
    @refuse_double_backward("FlashAttentionTriton")
    def backward(ctx, do: torch.Tensor):
        return backward_from_saved(ctx, attention_backward, do)


class FlashAttentionTritonKernelsFunction(torch.autograd.Function):
    """The autograd of FlashAttentionTritonKernels' calls that replay does not serve whole,
    and of every call under torch.compile."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                forward: str, backward: str) -> torch.Tensor:
        ctx.backward_kernels = backward
        return forward_saving_lse(ctx, _FORWARDS[forward], q, k, v, is_causal)

    @staticmethod
    @refuse_double_backward("FlashAttentionTriton")
    def backward(ctx, do: torch.Tensor):
        return (*backward_from_saved(ctx, _BACKWARDS[ctx.backward_kernels], do), None, None)


class FlashAttentionTritonKernels(FlashAttentionTritonKernelsFunction):
    """Attention with named kernels: `.apply(q, k, v, is_causal, forward, backward)`, a
    forward of `dispatch.FORWARDS` and a backward of `dispatch.BACKWARDS`. FlashAttentionTriton
    runs through it where the dispatch picks kernels other than the default pair, and the
    named variants (`FlashAttentionTritonUnordered`, the registry's `triton_gluon_bwd`)
    always. Inputs the Gluon kernels cannot take are refused up front, with the reason.
    Eager calls of a layout seen before are served whole in C++, as FlashAttentionTriton's
    are."""

    @classmethod
    def apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              forward: str, backward: str) -> torch.Tensor:
        # Before replay: a Triton forward's Program, kept by calls of the default pair, does
        # not say that the Gluon backward takes these inputs.
        if forward == GLUON or backward != TWO_PASS:
            reason = gluon_unsupported_reason(q, k, v, is_causal)
            if reason is not None:
                raise ValueError(f"attention with the {forward} forward and the {backward} "
                                 f"backward {reason}")
        o = _replayed(q, k, v, is_causal, forward, backward)
        if o is not None:
            return o
        return FlashAttentionTritonKernelsFunction.apply(q, k, v, is_causal, forward, backward)


_FORWARDS = {TRITON: attention_forward, GLUON: attention_forward_gluon}
_BACKWARDS = {
    TWO_PASS: attention_backward,
    GLUON_ORDERED: functools.partial(attention_backward_gluon, deterministic=True),
    GLUON_UNORDERED: functools.partial(attention_backward_gluon, deterministic=False),
}
# The replay Programs of each kernel's calls (`replay.attend`).
_FORWARD_PROGRAMS = {TRITON: replay.TRITON_FORWARD, GLUON: replay.GLUON_FORWARD}
_BACKWARD_PROGRAMS = {TWO_PASS: replay.TWO_PASS_BACKWARD,
                      GLUON_ORDERED: replay.GLUON_ORDERED_BACKWARD,
                      GLUON_UNORDERED: replay.GLUON_UNORDERED_BACKWARD}
_BACKWARDS_BY_PROGRAM = {_BACKWARD_PROGRAMS[name]: backward
                         for name, backward in _BACKWARDS.items()}


def _replayed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              forward: str, backward: str) -> torch.Tensor | None:
    """o of a call with these kernels served whole in C++ (`replay.attend`), or None.
    Eager only: Dynamo traces the Python Functions instead."""
    if torch.compiler.is_compiling():
        return None
    return replay.attend(q, k, v, is_causal, _FORWARD_PROGRAMS[forward],
                         _BACKWARD_PROGRAMS[backward])


class FlashAttentionTriton(FlashAttentionTritonFunction):
    """FlashAttention-2 in Triton: `FlashAttentionTriton.apply(q, k, v, is_causal)`.

    Each call runs the fastest deterministic kernels of ours for its GPU, dtype, head dim,
    length and mask (`dispatch.TABLE`): the Triton forward and two-pass backward described
    below by default, the Gluon kernels for Hopper (FlashAttentionTritonKernels) where the
    table names them. Gradients are bit-identical from run to run either way.

    q: (..., n_queries, d), k and v: (..., n_keys, d), fp16/bf16/fp32, on a CUDA device (or
    the CPU under TRITON_INTERPRET=1), with any strides: views whose rows are unit-stride
    (such as (batch, seq, heads, d) projections seen as (batch, heads, seq, d)) are read in
    place, others copied; o and the gradients are laid out like q, k and v. Saves L (shape
    (..., n_queries)), q, k, v and o; backward runs the dQ and dK/dV kernels. Eager calls
    launch the kernels directly; under torch.compile they are custom ops (`op.py`). Double
    backward is refused.

    An eager call of a layout seen before is served whole in C++ (`replay.attend`), with
    whichever kernels the dispatch picks: the same kernels, under a C++ autograd node (named
    "torch::autograd::CppNode<systems::FlashAttentionTriton>") whose backward computes what
    the Python Function's does.
    """

    @classmethod
    def apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              is_causal: bool = False) -> torch.Tensor:
        check_is_causal("FlashAttentionTriton", is_causal)
        kernels = dispatch.choose(q, k, v, is_causal)
        if kernels is not dispatch.DEFAULT:
            return FlashAttentionTritonKernels.apply(q, k, v, is_causal, kernels.forward,
                                                     kernels.backward)
        o = _replayed(q, k, v, is_causal, TRITON, TWO_PASS)
        if o is not None:
            return o
        return FlashAttentionTritonFunction.apply(q, k, v, is_causal)


_REFUSAL = double_backward_refusal("FlashAttentionTriton")


def _backward_outside_replay(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
                             is_causal: bool, kernels: int
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The C++ node's backward where replay does not serve it: the Python Function's with
    the call's backward `kernels` (a replay Program number)."""
    backward = _BACKWARDS_BY_PROGRAM[kernels]
    return first_derivatives_only(
        _REFUSAL, lambda: backward(q, k, v, o, lse, do, is_causal),
        lambda: (lse, q, k, v, o, do))


replay.set_python_backward(_backward_outside_replay)


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


class FlashAttentionTritonCompiledBackward(FlashAttentionTritonFunction):
    """The Triton forward with a `torch.compile`d PyTorch backward (O(N^2) memory)."""

    @staticmethod
    @refuse_double_backward("FlashAttentionTritonCompiledBackward")
    def backward(ctx, do: torch.Tensor):
        return backward_from_saved(ctx, _compiled_recompute_backward, do)


class FlashAttentionTritonUnordered(FlashAttentionTritonKernels):
    """The Gluon kernels for Hopper with dQ added in the order the shares arrive (FA3's
    default): `FlashAttentionTritonUnordered.apply(q, k, v, is_causal)`. Faster than the
    ordered backward FlashAttentionTriton may pick, with dQ's last bits free to differ from
    run to run; never chosen unless asked for by this name.

    It takes causal bf16 self-attention on an sm_90 GPU with a head dim up to 128 and a
    sequence length that is a multiple of 128 (`gluon.backward.unsupported_reason`), and
    refuses other inputs with the reason. The forward is the Gluon one where it has a
    config for the head dim and pads it no wider than the Triton one, else the Triton one
    (`dispatch.with_gluon_backward`)."""

    @classmethod
    def apply(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              is_causal: bool = False) -> torch.Tensor:
        check_is_causal("FlashAttentionTritonUnordered", is_causal)
        kernels = dispatch.with_gluon_backward(q, GLUON_UNORDERED)
        return FlashAttentionTritonKernels.apply(q, k, v, is_causal, kernels.forward,
                                                 kernels.backward)
