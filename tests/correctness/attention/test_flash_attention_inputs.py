"""Bad input to the flash attention Functions: a clear error, never a wrong answer."""

from __future__ import annotations

import pytest
import torch

from systems.attention import FlashAttentionPytorch, FlashAttentionTriton
from systems.attention.flash_triton import launch

BOTH = pytest.mark.parametrize("attention", [FlashAttentionPytorch, FlashAttentionTriton],
                               ids=["pytorch", "triton"])


def _qkv(device, n_q=32, n_k=32, d=32, dtype=torch.float32, lead=(2,)):
    return (torch.randn(*lead, n_q, d, device=device, dtype=dtype),
            torch.randn(*lead, n_k, d, device=device, dtype=dtype),
            torch.randn(*lead, n_k, d, device=device, dtype=dtype))


@BOTH
def test_mismatched_dtypes(attention, device):
    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="dtypes differ"):
        attention.apply(q, k.half(), v, False)


@BOTH
def test_mismatched_devices(attention, device):
    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="different devices"):
        attention.apply(q, k.to("meta"), v, False)


@BOTH
@pytest.mark.parametrize(
    ("q_shape", "k_shape", "v_shape", "message"),
    [
        ((2, 32, 32), (2, 32, 16), (2, 32, 16), "head dims differ"),
        ((2, 32, 32), (2, 32, 32), (2, 31, 32), "k and v shapes differ"),
        ((2, 32, 32), (3, 32, 32), (3, 32, 32), "leading dims"),
        ((2, 0, 32), (2, 32, 32), (2, 32, 32), "empty"),
        ((32,), (32,), (32,), "shape"),
    ],
    ids=["head-dim", "k-v", "leading", "empty", "1d"],
)
def test_mismatched_shapes(attention, q_shape, k_shape, v_shape, message, device):
    q, k, v = (torch.randn(s, device=device) for s in (q_shape, k_shape, v_shape))
    with pytest.raises(ValueError, match=message):
        attention.apply(q, k, v, False)


@BOTH
@pytest.mark.parametrize("is_causal", ["yes", "", None, 1, 0.0, torch.tensor(True)],
                         ids=["str", "empty-str", "none", "int", "float", "tensor"])
def test_is_causal_must_be_a_bool(attention, is_causal, device):
    """A truth value is not a mask flag: "no" would read as causal, None as full."""
    q, k, v = _qkv(device)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        attention.apply(q, k, v, is_causal)


def test_triton_refuses_meta_tensors_clearly():
    """Meta tensors hold no data: refused up front, not a NotImplementedError from inside."""
    q, k, v = _qkv("meta")
    with pytest.raises(ValueError, match="meta tensors"):
        FlashAttentionTriton.apply(q, k, v, True)


@BOTH
def test_integer_inputs(attention, device):
    q, k, v = (torch.ones(2, 8, 16, dtype=torch.int32, device=device) for _ in range(3))
    with pytest.raises(ValueError, match="floating"):
        attention.apply(q, k, v, False)


@pytest.mark.parametrize("d", [8, 15, 129, 256])
def test_triton_rejects_unsupported_head_dims(d, device):
    with pytest.raises(ValueError, match="head dim"):
        FlashAttentionTriton.apply(*_qkv(device, d=d), True)


def test_triton_rejects_float64(device):
    with pytest.raises(ValueError, match="unsupported"):
        FlashAttentionTriton.apply(*_qkv(device, dtype=torch.float64), True)


@pytest.fixture
def fresh_input_checks(monkeypatch):
    """Forget which input signatures passed: the tests below change the runtime's rules."""
    monkeypatch.setattr(launch, "_CHECKED_SIGNATURES", set())


def test_triton_rejects_cpu_tensors_without_interpreter(monkeypatch, fresh_input_checks):
    monkeypatch.setattr(launch, "INTERPRETED", False)
    with pytest.raises(ValueError, match="CUDA tensors"):
        FlashAttentionTriton.apply(*_qkv("cpu"), False)


def test_triton_interpreter_rejects_bf16(monkeypatch, fresh_input_checks):
    monkeypatch.setattr(launch, "INTERPRETED", True)
    with pytest.raises(ValueError, match="bf16"):
        FlashAttentionTriton.apply(*_qkv("cpu", dtype=torch.bfloat16), False)


@BOTH
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_double_backward_is_refused(attention, is_causal, device):
    """The backward passes treat L as a constant, so their gradients must not be
    differentiated: doing so raises instead of returning a wrong second derivative."""
    q, k, v = (t.requires_grad_() for t in _qkv(device, n_q=24, n_k=40, d=16))
    o = attention.apply(q, k, v, is_causal)
    dq, dk, dv = torch.autograd.grad(o.square().sum(), (q, k, v), create_graph=True)
    for grad, wrt in ((dq, q), (dk, k), (dv, v), (dq, v)):
        with pytest.raises(RuntimeError, match="does not support double backward"):
            torch.autograd.grad(grad.square().sum(), wrt, retain_graph=True)


def test_pytorch_gradgradcheck_is_refused(device):
    """gradgradcheck used to pass through a wrong second derivative (its numerical check
    then failed); the Triton kernels are covered by the test above (no fp64 kernels)."""
    inputs = [t.double().requires_grad_() for t in _qkv(device, n_q=6, n_k=6, d=16, lead=(1,))]
    with pytest.raises(RuntimeError, match="does not support double backward"):
        torch.autograd.gradgradcheck(
            lambda q, k, v: FlashAttentionPytorch.apply(q, k, v, True), inputs)


@BOTH
def test_first_order_gradients_under_create_graph_are_unchanged(attention, device):
    q, k, v = (t.requires_grad_() for t in _qkv(device, n_q=24, n_k=40, d=16))
    plain = torch.autograd.grad(attention.apply(q, k, v, True).sum(), (q, k, v))
    graphed = torch.autograd.grad(attention.apply(q, k, v, True).sum(), (q, k, v),
                                  create_graph=True)
    for a, b in zip(plain, graphed, strict=True):
        torch.testing.assert_close(b, a, atol=0, rtol=0)


@pytest.mark.parametrize(("shape", "strides", "expected"), [
    ((2, 3, 5, 16), (240, 80, 16, 1), (240, 80, 16)),  # packed
    ((2, 3, 5, 16), (240, 16, 48, 1), (240, 16, 48)),  # (batch, seq, heads, d) seen per head
    ((5, 16), (16, 1), (80, 80, 16)),  # one matrix: sizes of 1 take packed strides
    ((2, 1, 1, 16), (16, 99, 7, 1), (16, 16, 16)),
    ((2, 4, 3, 5, 16), (960, 240, 80, 16, 1), (240, 80, 16)),  # batch dims merge
    ((2, 4, 3, 5, 16), (240, 480, 80, 16, 1), None),  # batch dims stored swapped
    ((2, 3, 5, 16), (240, 80, 1, 5), None),  # head dim not unit-stride
    ((2, 3, 5, 16), (240, 80, 20, 1), None),  # rows 20 elements apart: 40 bytes, not 16-aligned
    ((2, 3, 5, 16), (0, 80, 16, 1), None),  # expanded batch
    ((2, 3, 5, 12), (180, 60, 12, 1), None),  # rows of 12 where the kernels read 16
])
def test_matrix_strides_say_what_the_kernels_read_in_place(shape, strides, expected):
    assert launch._matrix_strides(torch.Size(shape), strides, 2, 16) == expected
