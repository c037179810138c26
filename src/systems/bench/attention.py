"""Attention workloads: each implementation on random q, k, v, one pass at a time.

FLOPs follow the usual convention: 4 * BH * n_q * n_k * d for a forward (two matmuls),
halved under the causal mask; backward counts 2.5 forwards, forward+backward 3.5.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from systems.attention import FlashAttentionPytorch, FlashAttentionTriton, reference_attention
from systems.attention.flash_triton import FlashAttentionTritonCompiledBackward
from systems.attention.flash_triton.launch import INTERPRETED

ATTENTION_IMPLEMENTATIONS = (
    "reference", "reference_compiled", "sdpa_flash", "sdpa_cudnn", "flex_compiled",
    "flash_pytorch", "triton_compiled_bwd", "triton", "triton_compiled",
)
ATTENTION_MODES = ("forward", "backward", "forward_backward")
_MODE_FLOPS = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}
# The PyTorch flash reference launches a few ops per tile pair, so its time grows as seq^2
# in Python overhead alone (about 2 s per forward+backward at 4096 on an H100).
FLASH_PYTORCH_MAX_SEQ = 4096
_SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class UnsupportedWorkload(Exception):
    """The implementation cannot run this workload here (a recorded outcome, not a bug)."""


def attention_flops(bh: int, n_q: int, n_k: int, head_dim: int, causal: bool,
                    mode: str) -> float:
    forward = 4.0 * bh * n_q * n_k * head_dim / (2 if causal else 1)
    return forward * _MODE_FLOPS[mode]


@functools.cache
def _compiled(fn: Callable) -> Callable:
    # One compiled wrapper per function, so every case shares Dynamo's cache.
    return torch.compile(fn)


def _sdpa(backend_name: str, causal: bool, device: torch.device, dtype: torch.dtype
          ) -> AttentionFn:
    if device.type != "cuda" or dtype == torch.float32:
        raise UnsupportedWorkload(f"SDPA's {backend_name} backend needs fp16/bf16 on CUDA")
    chosen = _SDPA_BACKENDS[backend_name]

    def attend(q, k, v):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return attend


def _flex(causal: bool, device: torch.device, n_q: int, n_k: int) -> AttentionFn:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if device.type != "cuda":
        raise UnsupportedWorkload("compiled flex_attention is benchmarked on CUDA only")
    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None,
                                       n_q, n_k, device=device)
    compiled = _compiled(flex_attention)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _triton(function: type[torch.autograd.Function], device: torch.device,
            dtype: torch.dtype) -> type[torch.autograd.Function]:
    if device.type != "cuda" and not INTERPRETED:
        raise UnsupportedWorkload("the Triton kernels need CUDA or TRITON_INTERPRET=1")
    if INTERPRETED and dtype == torch.bfloat16:
        raise UnsupportedWorkload("bf16 Triton kernels need a GPU (the interpreter is wrong)")
    return function


def attention_function(impl: str, *, causal: bool, device: torch.device, dtype: torch.dtype,
                       n_q: int, n_k: int) -> AttentionFn:
    """The callable `impl` names, or UnsupportedWorkload with the reason."""
    if impl == "reference":
        return functools.partial(reference_attention, is_causal=causal)
    if impl == "reference_compiled":
        return functools.partial(_compiled(reference_attention), is_causal=causal)
    if impl in ("sdpa_flash", "sdpa_cudnn"):
        return _sdpa(impl.removeprefix("sdpa_"), causal, device, dtype)
    if impl == "flex_compiled":
        return _flex(causal, device, n_q, n_k)
    if impl == "flash_pytorch":
        if max(n_q, n_k) > FLASH_PYTORCH_MAX_SEQ:
            raise UnsupportedWorkload(f"Python tile loops; run up to seq {FLASH_PYTORCH_MAX_SEQ}")
        return lambda q, k, v: FlashAttentionPytorch.apply(q, k, v, causal)
    if impl == "triton":
        function = _triton(FlashAttentionTriton, device, dtype)
        return lambda q, k, v: function.apply(q, k, v, causal)
    if impl == "triton_compiled":
        apply = _compiled(_triton(FlashAttentionTriton, device, dtype).apply)
        return lambda q, k, v: apply(q, k, v, causal)
    if impl == "triton_compiled_bwd":
        function = _triton(FlashAttentionTritonCompiledBackward, device, dtype)
        return lambda q, k, v: function.apply(q, k, v, causal)
    raise ValueError(f"unknown attention implementation {impl!r}; choose one of "
                     f"{ATTENTION_IMPLEMENTATIONS}")


@dataclass
class AttentionWorkload:
    """One pass of one implementation, ready to time; `info` describes it for extra_info."""

    step: Callable[[], object]
    flops: float
    info: dict[str, object] = field(default_factory=dict)


def build_attention_workload(
    impl: str, *, shape: tuple[int, ...], dtype: torch.dtype, mode: str, causal: bool,
    device: torch.device, seed: int = 0,
) -> AttentionWorkload:
    """q, k, v of `shape` (..., seq, d), random; `step` runs `mode` once.

    For "backward" the forward runs here, once, and each step recomputes the gradients
    from the retained graph; `info` then holds the memory in use before backward.
    """
    if mode not in ATTENTION_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {ATTENTION_MODES}")
    *lead, seq, head_dim = shape
    attend = attention_function(impl, causal=causal, device=device, dtype=dtype,
                                n_q=seq, n_k=seq)
    generator = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(shape, generator=generator, device=device, dtype=dtype)
                   for _ in range(4))
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    info: dict[str, object] = {
        "implementation": impl, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
        "causal": causal, "mode": mode,
    }

    def forward() -> None:
        with torch.no_grad():
            attend(*inputs)

    def forward_backward() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(attend(*inputs), inputs, do)

    if mode == "forward":
        step: Callable[[], object] = forward
    elif mode == "forward_backward":
        step = forward_backward
    else:
        out = attend(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            info["memory_before_backward_bytes"] = torch.cuda.memory_allocated(device)
        step = functools.partial(torch.autograd.grad, out, inputs, do, retain_graph=True)
    flops = attention_flops(math.prod(lead), seq, seq, head_dim, causal, mode)
    return AttentionWorkload(step, flops, info)
