"""The registry's SDPA rivals pinned to one backend: pinned, equal to SDPA, and leaving
SDPA's backend switches as they found them."""

from __future__ import annotations

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
