"""Attention implementations selectable by name: the model's backends and the benchmarks'
rivals, each one callable `(q, k, v, is_causal=False) -> o` with q: (..., n_queries, d).

The benchmarks (`systems.bench.attention`, tests/perf/test_attention.py) and the model look
implementations up here; `unsupported_reason` says where one cannot run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from systems.attention.dispatch import GLUON_ORDERED, TRITON, TWO_PASS, with_gluon_backward
from systems.attention.flash_pytorch import FlashAttentionPytorch
from systems.attention.functions import (
    FlashAttentionTriton,
    FlashAttentionTritonCompiledBackward,
    FlashAttentionTritonKernels,
    FlashAttentionTritonUnordered,
)
from systems.attention.gluon.backward import unsupported_setting as gluon_unsupported_setting
from systems.attention.reference import reference_attention, sdpa_attention
from systems.attention.shared.causal import causal_mask_mod
from systems.kernel_runtime.interpreter import INTERPRETED

AttentionFn = Callable[..., torch.Tensor]
# The tiled PyTorch FlashAttention-2 launches a few ops per tile pair, so its time grows as
# seq^2 in Python overhead alone (about 2 s per forward+backward at 4096 on an H100).
FLASH_PYTORCH_MAX_SEQ = 4096


def flash_pytorch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool = False) -> torch.Tensor:
    return FlashAttentionPytorch.apply(q, k, v, is_causal)


def flash_triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           is_causal: bool = False) -> torch.Tensor:
    # The Triton kernels read the model's per-head views of its projections in place.
    return FlashAttentionTriton.apply(q, k, v, is_causal)


def triton_two_pass_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              is_causal: bool = False) -> torch.Tensor:
    """The Triton forward and two-pass backward whatever the dispatch would pick (what
    every shape without a rule runs): to measure what the dispatch's other kernels buy."""
    return FlashAttentionTritonKernels.apply(q, k, v, is_causal, TRITON, TWO_PASS)


def triton_compiled_backward_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                       is_causal: bool = False) -> torch.Tensor:
    return FlashAttentionTritonCompiledBackward.apply(q, k, v, is_causal)


def triton_gluon_backward_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    is_causal: bool = False) -> torch.Tensor:
    """The ordered Gluon backward whatever the dispatch would pick: to compare with it."""
    kernels = with_gluon_backward(q, GLUON_ORDERED)
    return FlashAttentionTritonKernels.apply(q, k, v, is_causal, kernels.forward,
                                             kernels.backward)


def triton_unordered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               is_causal: bool = False) -> torch.Tensor:
    return FlashAttentionTritonUnordered.apply(q, k, v, is_causal)


# SDPA's backend switches: each backend's setter and getter (torch.backends.cuda).
_SDPA_SWITCHES = {
    SDPBackend.FLASH_ATTENTION: (torch.backends.cuda.enable_flash_sdp,
                                 torch.backends.cuda.flash_sdp_enabled),
    SDPBackend.EFFICIENT_ATTENTION: (torch.backends.cuda.enable_mem_efficient_sdp,
                                     torch.backends.cuda.mem_efficient_sdp_enabled),
    SDPBackend.MATH: (torch.backends.cuda.enable_math_sdp, torch.backends.cuda.math_sdp_enabled),
    SDPBackend.CUDNN_ATTENTION: (torch.backends.cuda.enable_cudnn_sdp,
                                 torch.backends.cuda.cudnn_sdp_enabled),
}


def _sdpa_with(backend: SDPBackend) -> AttentionFn:
    """SDPA pinned to one backend, as a rival at its best. `sdpa_kernel`, the documented
    way to pin, is a Python context manager whose entry and exit per call cost a short
    eager call several times SDPA's own dispatch on the host; a training loop enters it
    once, not per call. So each call sets the same switches directly and restores them:
    SDPA still refuses what the backend cannot run, and no other code sees the pin."""
    switches = tuple((enable, enabled, kind == backend)
                     for kind, (enable, enabled) in _SDPA_SWITCHES.items())

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               is_causal: bool = False) -> torch.Tensor:
        before = [enabled() for _, enabled, _ in switches]
        for enable, _, on in switches:
            enable(on)
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        finally:
            for (enable, _, _), was in zip(switches, before, strict=True):
                enable(was)

    attend.__name__ = f"sdpa_{backend.name.lower()}"
    return attend


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(n_q: int, n_k: int, device: torch.device) -> object:
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(causal_mask_mod, None, None, n_q, n_k, device=device)


def flex_compiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool = False) -> torch.Tensor:
    """Compiled flex_attention; q, k, v: (batch, heads, seq, d)."""
    mask = _causal_block_mask(q.shape[-2], k.shape[-2], q.device) if is_causal else None
    return _compiled_flex()(q, k, v, block_mask=mask)


def flash_attention_4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      is_causal: bool = False) -> torch.Tensor:
    """FlashAttention-4 (the `flash-attn-4` package's CuTe kernels, its default
    non-deterministic backward) on our layout: it takes (batch, seq, heads, d), so the
    leading dims are one batch dim and the heads are read in place, transposed."""
    from flash_attn.cute import flash_attn_func

    def per_token(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1, *t.shape[-3:]).transpose(1, 2) if t.dim() >= 3 else t[None, :, None]

    out = flash_attn_func(per_token(q), per_token(k), per_token(v), causal=is_causal)
    out = out[0] if isinstance(out, tuple) else out  # (out, lse)
    return out.transpose(1, 2).reshape(q.shape) if q.dim() >= 3 else out[0, :, 0]


@functools.cache
def _flash_attention_4_missing() -> str | None:
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as error:  # not installed, or installed without what it needs
        return f"needs the flash-attn-4 package (flash_attn.cute): {type(error).__name__}: {error}"
    return None


def _flash_attention_4_limits(device: torch.device, dtype: torch.dtype, seq: int) -> str | None:
    return _flash_attention_4_missing()


@dataclass(frozen=True)
class AttentionBackend:
    """One implementation and where it can run."""

    fn: AttentionFn
    needs_cuda: bool = False
    half_precision_only: bool = False
    triton_kernels: bool = False  # CUDA, or Triton's interpreter (which computes bf16 wrongly)
    max_seq: int | None = None  # longer sequences are impractical, not wrong
    saves_scores: bool = False  # autograd keeps the (n_q, n_k) probabilities for backward
    # What else the implementation refuses: (device, dtype, seq) -> the reason, or None.
    limits: Callable[[torch.device, torch.dtype, int], str | None] | None = None

    def unsupported_reason(self, device: torch.device, dtype: torch.dtype,
                           seq: int) -> str | None:
        on_cuda = device.type == "cuda"
        if self.needs_cuda and not on_cuda:
            return "runs on CUDA only"
        if self.half_precision_only and dtype == torch.float32:
            return "needs fp16/bf16"
        if self.triton_kernels and not on_cuda and not INTERPRETED:
            return "the Triton kernels need CUDA or TRITON_INTERPRET=1"
        if self.triton_kernels and INTERPRETED and dtype == torch.bfloat16:
            return "bf16 Triton kernels need a GPU (the interpreter computes them wrongly)"
        if self.max_seq is not None and seq > self.max_seq:
            return f"Python tile loops; run up to seq {self.max_seq}"
        return self.limits(device, dtype, seq) if self.limits else None


ATTENTION_BACKENDS: dict[str, AttentionBackend] = {
    "reference": AttentionBackend(reference_attention, saves_scores=True),
    "reference_compiled": AttentionBackend(torch.compile(reference_attention),
                                           saves_scores=True),
    "sdpa": AttentionBackend(sdpa_attention),
    "sdpa_flash": AttentionBackend(_sdpa_with(SDPBackend.FLASH_ATTENTION), needs_cuda=True,
                                   half_precision_only=True),
    "sdpa_cudnn": AttentionBackend(_sdpa_with(SDPBackend.CUDNN_ATTENTION), needs_cuda=True,
                                   half_precision_only=True),
    "flex_compiled": AttentionBackend(flex_compiled_attention, needs_cuda=True),
    "flash_pytorch": AttentionBackend(flash_pytorch_attention, max_seq=FLASH_PYTORCH_MAX_SEQ),
    # FlashAttentionTriton: our fastest deterministic kernels for each problem (`dispatch`).
    "triton": AttentionBackend(flash_triton_attention, triton_kernels=True),
    "triton_two_pass": AttentionBackend(triton_two_pass_attention, triton_kernels=True),
    "triton_compiled": AttentionBackend(torch.compile(flash_triton_attention),
                                        triton_kernels=True),
    "triton_compiled_bwd": AttentionBackend(triton_compiled_backward_attention,
                                            triton_kernels=True),
    # The fused Gluon backward for Hopper (causal bf16 on sm_90, d up to 128, seq a multiple
    # of 128): ordered (what the dispatch may pick, here forced), and FlashAttentionTritonUnordered.
    "triton_gluon_bwd": AttentionBackend(triton_gluon_backward_attention,
                                         limits=gluon_unsupported_setting),
    "triton_gluon_bwd_unordered": AttentionBackend(triton_unordered_attention,
                                                   limits=gluon_unsupported_setting),
    # The rival on Hopper and Blackwell, where it is installed.
    "fa4": AttentionBackend(flash_attention_4, needs_cuda=True, half_precision_only=True,
                            limits=_flash_attention_4_limits),
}


def _backend(name: str) -> AttentionBackend:
    try:
        return ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}"
        ) from None


def get_attention(name: str) -> AttentionFn:
    return _backend(name).fn


def saves_scores(name: str) -> bool:
    """Whether the named attention keeps its score matrices for backward (memory models)."""
    return _backend(name).saves_scores


def unsupported_reason(name: str, device: torch.device, dtype: torch.dtype,
                       seq: int) -> str | None:
    """Why `name` cannot run on this device, dtype and sequence length; None if it can."""
    return _backend(name).unsupported_reason(device, dtype, seq)
