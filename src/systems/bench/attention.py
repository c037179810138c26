"""Attention workloads: each implementation on random q, k, v, one pass at a time.

FLOPs are `systems.accounting.attention_flops`: 4 * BH * n_q * n_k * d for a forward (two
matmuls), halved under the causal mask; backward counts 2.5 forwards, forward+backward 3.5.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from systems.accounting import ATTENTION_MODE_FLOPS, attention_flops
from systems.attention import get_attention, unsupported_reason

ATTENTION_MODES = tuple(ATTENTION_MODE_FLOPS)

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class UnsupportedWorkload(Exception):
    """The implementation cannot run this workload here (a recorded outcome, not a bug)."""


def attention_function(impl: str, *, is_causal: bool, device: torch.device, dtype: torch.dtype,
                       n_q: int, n_k: int) -> AttentionFn:
    """The registry's `impl` with the mask bound, or UnsupportedWorkload with the reason."""
    reason = unsupported_reason(impl, device, dtype, max(n_q, n_k))
    if reason is not None:
        raise UnsupportedWorkload(f"{impl}: {reason}")
    return functools.partial(get_attention(impl), is_causal=is_causal)


@dataclass
class AttentionWorkload:
    """One pass of one implementation, ready to time; `info` describes it for extra_info."""

    step: Callable[[], object]
    flops: float
    info: dict[str, object] = field(default_factory=dict)


def build_attention_workload(
    impl: str, *, shape: tuple[int, ...], dtype: torch.dtype, mode: str, is_causal: bool,
    device: torch.device, seed: int = 0,
) -> AttentionWorkload:
    """q, k, v of `shape` (..., seq, d), random; `step` runs `mode` once.

    For "backward" the forward runs here, once, and each step recomputes the gradients
    from the retained graph; `info` then holds the memory in use before backward.
    """
    if mode not in ATTENTION_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {ATTENTION_MODES}")
    *lead, seq, head_dim = shape
    attend = attention_function(impl, is_causal=is_causal, device=device, dtype=dtype,
                                n_q=seq, n_k=seq)
    generator = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(shape, generator=generator, device=device, dtype=dtype)
                   for _ in range(4))
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    info: dict[str, object] = {
        "implementation": impl, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
        "causal": is_causal, "mode": mode,  # the histories' key
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
    flops = attention_flops(math.prod(lead), seq, seq, head_dim, is_causal, mode)
    return AttentionWorkload(step, flops, info)
