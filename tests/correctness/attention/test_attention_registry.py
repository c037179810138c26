"""The registry's SDPA rivals pinned to one backend: pinned, equal to SDPA, and leaving
SDPA's backend switches as they found them."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from systems.attention.registry import get_attention

SWITCHES = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
            torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)


def _switches() -> list[bool]:
    return [enabled() for enabled in SWITCHES]


@pytest.mark.parametrize("is_causal", [False, True])
def test_pinned_flash_equals_sdpa_pinned_by_its_context_manager(is_causal: bool) -> None:
    q, k, v = (torch.randn(2, 3, 37, 16, requires_grad=True) for _ in range(3))
    out = get_attention("sdpa_flash")(q, k, v, is_causal=is_causal)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=0, atol=0)


def test_the_pin_is_undone_after_each_call_also_when_sdpa_refuses() -> None:
    q = torch.randn(1, 1, 8, 16)
    start = _switches()
    get_attention("sdpa_flash")(q, q, q)
    assert _switches() == start
    # cuDNN has no CPU kernel: pinned to it, SDPA must refuse rather than fall back.
    with pytest.raises(RuntimeError):
        get_attention("sdpa_cudnn")(q, q, q)
    assert _switches() == start


def test_the_pin_restores_a_caller_s_own_switches() -> None:
    q = torch.randn(1, 1, 8, 16)
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
        inside = _switches()
        get_attention("sdpa_flash")(q, q, q)
        assert _switches() == inside


@pytest.mark.parametrize("shape", [(2, 3, 37, 16), (3, 37, 16), (37, 16), (2, 2, 3, 37, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_fa4_reads_our_layout_as_its_own(shape, is_causal: bool, monkeypatch) -> None:
    """FlashAttention-4 takes (batch, seq, heads, d) and returns (out, lse): on our
    (..., heads, seq, d) layout the registry's `fa4` gives what attention per head gives,
    with gradients (here with SDPA math standing in for its kernels)."""
    def flash_attn_func(q, k, v, causal=False):
        assert q.dim() == 4 and q.stride(-1) == 1
        per_head = [t.transpose(1, 2) for t in (q, k, v)]  # (batch, heads, seq, d)
        out = F.scaled_dot_product_attention(*per_head, is_causal=causal).transpose(1, 2)
        return out, None

    cute = type(sys)("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", type(sys)("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    q, k, v = (torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = get_attention("fa4")(q, k, v, is_causal=is_causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for grad, want in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(grad, want)
