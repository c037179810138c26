"""The chunked LM head + cross-entropy against the plain head and loss."""

from __future__ import annotations

import pytest
import torch

from systems.model import MODEL_CONFIGS, TransformerLM, cross_entropy
from systems.model.loss import LinearCrossEntropy, linear_cross_entropy


def _problem(tokens: int, d: int, vocab: int, dtype: torch.dtype = torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d, dtype=dtype, generator=generator).requires_grad_()
    weight = (torch.randn(vocab, d, dtype=dtype, generator=generator) / d**0.5).requires_grad_()
    return x, weight, torch.randint(vocab, (tokens,), generator=generator)


def _loss_and_grads(loss_fn, x, weight, targets):
    loss = loss_fn(x, weight, targets)
    return (loss, *torch.autograd.grad(loss, (x, weight)))


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, 1000])  # one token .. one chunk, ragged
def test_matches_plain_head_and_loss_in_float64(chunk_tokens: int) -> None:
    x, weight, targets = _problem(64, 24, 50)
    fused = _loss_and_grads(lambda *a: linear_cross_entropy(*a, chunk_tokens), x, weight, targets)
    plain = _loss_and_grads(lambda x, w, t: cross_entropy(x @ w.T, t), x, weight, targets)
    for got, expected in zip(fused, plain, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_gradcheck_on_tiny_double_inputs() -> None:
    x, weight, targets = _problem(9, 5, 7)
    assert torch.autograd.gradcheck(
        lambda x, w: LinearCrossEntropy.apply(x, w, targets, torch.float64, 4), (x, weight))


def test_bf16_autocast_is_as_close_to_float64_as_the_plain_path() -> None:
    x, weight, targets = _problem(256, 64, 300, dtype=torch.float32)
    exact = _loss_and_grads(lambda x, w, t: cross_entropy(x.double() @ w.double().T, t),
                            x, weight, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _loss_and_grads(lambda *a: linear_cross_entropy(*a, 100), x, weight, targets)
        plain = _loss_and_grads(lambda x, w, t: cross_entropy(x @ w.T, t), x, weight, targets)
    assert fused[0].dtype == torch.float32
    assert (fused[1].dtype, fused[2].dtype) == (x.dtype, weight.dtype)
    for got, ref, want in zip(fused, plain, exact, strict=True):
        plain_error = (ref.double() - want).abs().max().item()
        assert (got.double() - want).abs().max().item() <= 2 * plain_error + 1e-6


def test_saves_no_tokens_by_vocab_tensor() -> None:
    tokens, d, vocab = 96, 16, 400
    x, weight, targets = _problem(tokens, d, vocab, dtype=torch.float32)
    saved: list[torch.Size] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        linear_cross_entropy(x, weight, targets, chunk_tokens=32)
    assert saved and all(shape.numel() <= vocab * d for shape in saved)
    # The plain path does keep one: the check above can tell them apart.
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        cross_entropy(x @ weight.T, targets)
    assert any(shape.numel() >= tokens * vocab for shape in saved)


def test_without_grad_only_the_loss_is_computed() -> None:
    x, weight, targets = _problem(20, 8, 30)
    with torch.no_grad():
        loss = linear_cross_entropy(x, weight, targets, 6)
    torch.testing.assert_close(loss, cross_entropy(x @ weight.T, targets).detach())


def test_mismatched_targets_are_a_clear_error() -> None:
    x, weight, targets = _problem(8, 4, 5)
    with pytest.raises(ValueError, match="do not match"):
        linear_cross_entropy(x, weight, targets[:-1])


def test_model_with_targets_returns_the_plain_loss() -> None:
    config = MODEL_CONFIGS["tiny"]
    torch.manual_seed(0)
    model = TransformerLM(config).double()
    tokens, targets = torch.randint(config.vocab_size, (2, 3, 20))
    fused = model(tokens, targets, chunk_tokens=16)
    torch.testing.assert_close(fused, cross_entropy(model(tokens), targets), rtol=1e-12,
                               atol=1e-12)
