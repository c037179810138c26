"""Our model's dtypes under the suite's bf16 precision (`model.train_step.autocast_context`):
what the activation model (`accounting.saved_tensors`) and the bf16 recipes assume."""

from __future__ import annotations

import pytest
import torch

from systems.model import MODEL_CONFIGS, TransformerLM, cross_entropy
from systems.model.layers import RMSNorm, TransformerBlock
from systems.model.train_step import autocast_context


def test_bf16_autocast_keeps_the_residual_stream_norms_loss_and_gradients_fp32(device) -> None:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("bf16 unsupported on this GPU")
    config = MODEL_CONFIGS["tiny"]
    torch.manual_seed(0)
    model = TransformerLM(config).to(device)
    outputs: dict[str, set[torch.dtype]] = {"block": set(), "norm": set(), "linear": set()}
    for module in model.modules():
        group = ("block" if isinstance(module, TransformerBlock) else
                 "norm" if isinstance(module, RMSNorm) else
                 "linear" if isinstance(module, torch.nn.Linear) else None)
        if group:
            module.register_forward_hook(
                lambda _m, _i, out, group=group: outputs[group].add(out.dtype))
    tokens = torch.randint(config.vocab_size, (2, 2, 24), device=device)
    with autocast_context(device, "bf16"):
        logits = model(tokens[0])
        loss = cross_entropy(logits, tokens[1])
    loss.backward()
    # Autocast casts copies for the matmuls; the weights themselves stay fp32.
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert outputs["linear"] == {torch.bfloat16} and logits.dtype == torch.bfloat16
    # fp32 embeddings plus bf16 block outputs stay fp32, and RMSNorm hands back its input's
    # dtype: the residual stream and the norms are fp32.
    assert outputs["block"] == outputs["norm"] == {torch.float32}
    assert loss.dtype == torch.float32
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}


def test_fp32_precision_casts_nothing(device) -> None:
    config = MODEL_CONFIGS["tiny"]
    model = TransformerLM(config).to(device)
    tokens = torch.randint(config.vocab_size, (2, 16), device=device)
    with autocast_context(device, "fp32"):
        assert model(tokens).dtype == torch.float32
