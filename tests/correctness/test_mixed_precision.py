"""What autocast does to a toy model's dtypes, and why mixed precision accumulates in fp32."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class ToyModel(nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 10, d_out: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden, bias=False)
        self.ln = nn.LayerNorm(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def _supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" or dtype != torch.bfloat16 or torch.cuda.is_bf16_supported()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_autocast_dtypes_of_a_toy_model(device, dtype) -> None:
    if not _supported(device, dtype):
        pytest.skip(f"{dtype} unsupported on this GPU")
    torch.manual_seed(0)
    model = ToyModel().to(device)
    outputs: dict[str, torch.dtype] = {}
    for name in ("fc1", "relu", "ln", "fc2"):
        getattr(model, name).register_forward_hook(
            lambda _m, _i, out, name=name: outputs.__setitem__(name, out.dtype))
    x = torch.randn(8, 16, device=device)
    with torch.autocast(device_type=device.type, dtype=dtype):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, torch.randint(5, (8,), device=device))
    loss.backward()
    # Parameters stay fp32: autocast casts copies for the matmuls, not the weights.
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # Matmuls run in the low precision, and ReLU keeps its input's dtype.
    assert outputs["fc1"] == outputs["relu"] == dtype
    # CUDA autocast runs LayerNorm in fp32 (its statistics need the range); CPU autocast
    # leaves it off its fp32 list, so there it returns the low-precision input's dtype.
    assert outputs["ln"] == (torch.float32 if device.type == "cuda" else dtype)
    assert outputs["fc2"] == logits.dtype == dtype
    # The loss is computed in fp32, and gradients take their parameters' dtype.
    assert loss.dtype == torch.float32
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}


def _accumulate(total_dtype: torch.dtype, step_dtype: torch.dtype, steps: int = 1000) -> float:
    total = torch.tensor(0.0, dtype=total_dtype)
    step = torch.tensor(0.01, dtype=step_dtype)
    for _ in range(steps):
        total += step.to(total_dtype)
    return total.item()


def test_accumulation_needs_a_wide_accumulator() -> None:
    fp32 = _accumulate(torch.float32, torch.float32)
    fp16 = _accumulate(torch.float16, torch.float16)
    mixed = _accumulate(torch.float32, torch.float16)
    # fp32 accumulation: rounding of 1000 additions stays tiny.
    assert abs(fp32 - 10.0) < 1e-3
    # fp16 accumulation: once the sum grows, 0.01 is below half an fp16 step (8 has a
    # spacing of 2**-7) and each addition rounds badly: far off.
    assert abs(fp16 - 10.0) > 0.02
    # fp16 addend, fp32 accumulator: the only error is 0.01's own fp16 rounding, x1000.
    addend = torch.tensor(0.01, dtype=torch.float16).item()
    assert mixed == pytest.approx(1000 * addend, abs=1e-3)
    assert abs(mixed - 10.0) < abs(fp16 - 10.0)
