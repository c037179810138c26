"""Updates launched during backward (systems.optim.in_backward) equal `optimizer.step()`
after backward, bit for bit, and refuse what they cannot do."""

from __future__ import annotations

import pytest
import torch

from systems.bench.workloads import StepOptions, build_model_workload
from systems.model import get_config
from systems.optim import AdamW
from systems.optim.in_backward import UpdateInBackward


def _train(update_in_backward: bool, optimizer_name: str, device: str,
           steps: int = 4) -> list[torch.Tensor]:
    workload = build_model_workload(
        get_config("tiny"), batch_size=2, seq_len=16, mode="train_step",
        precision="bf16" if optimizer_name == "mixed_precision" else "fp32",
        device=device, seed=5,
        options=StepOptions(optimizer=optimizer_name, update_in_backward=update_in_backward,
                            lr=3e-3))
    generator = torch.Generator().manual_seed(11)
    for _ in range(steps):
        tokens = torch.randint(workload.config.vocab_size, (2, 2, 16), generator=generator)
        workload.load_batch(tokens[0].to(device), tokens[1].to(device))
        workload.step()
    return [p.detach().cpu() for p in workload.model.parameters()]


@pytest.mark.parametrize("optimizer_name,device", [
    ("adamw", "cpu"),
    pytest.param("mixed_precision", "cpu", marks=pytest.mark.interpreter),
    pytest.param("adamw", "cuda", marks=pytest.mark.gpu),
    pytest.param("mixed_precision", "cuda", marks=pytest.mark.gpu),
])
def test_train_steps_equal_step_after_backward(optimizer_name, device):
    after = _train(False, optimizer_name, device)
    during = _train(True, optimizer_name, device)
    untrained = _train(False, optimizer_name, device, steps=0)
    assert any(not torch.equal(a, b) for a, b in zip(untrained, after, strict=True))
    for a, b in zip(after, during, strict=True):
        assert torch.equal(a, b)


def _linear_pair() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)


def test_updates_happen_during_backward_in_bucket_order():
    first, second = _linear_pair()
    optimizer = AdamW([*first.parameters(), *second.parameters()], lr=0.1)
    updated: list[str] = []
    original = optimizer._step_group
    optimizer._step_group = lambda group, params: (  # type: ignore[method-assign]
        updated.append("second" if params[0] is second.weight else "first"),
        original(group, params))
    updater = UpdateInBackward(optimizer, [list(second.parameters()), list(first.parameters())])
    second(first(torch.randn(5, 4))).square().sum().backward()
    assert updated == ["second", "first"]  # both launched by backward itself, last layer first
    updater.finish()
    assert updated == ["second", "first"]


def test_parameter_without_gradient_is_skipped_like_step():
    first, second = _linear_pair()
    reference_first, reference_second = _linear_pair()
    optimizer = AdamW([*first.parameters(), *second.parameters()], lr=0.1)
    reference = AdamW([*reference_first.parameters(), *reference_second.parameters()], lr=0.1)
    updater = UpdateInBackward(optimizer, [list(first.parameters()), list(second.parameters())])
    x = torch.randn(5, 4)
    first(x).square().sum().backward()  # `second` gets no gradient
    reference_first(x).square().sum().backward()
    updater.finish()
    reference.step()
    for a, b in zip([*first.parameters(), *second.parameters()],
                    [*reference_first.parameters(), *reference_second.parameters()],
                    strict=True):
        assert torch.equal(a, b)


def test_refuses_incomplete_or_overlapping_buckets_and_other_optimizers():
    first, second = _linear_pair()
    optimizer = AdamW([*first.parameters(), *second.parameters()], lr=0.1)
    with pytest.raises(ValueError, match="in no bucket"):
        UpdateInBackward(optimizer, [list(first.parameters())])
    with pytest.raises(ValueError, match="two buckets"):
        UpdateInBackward(optimizer, [list(first.parameters()),
                                     [*second.parameters(), first.weight]])
    with pytest.raises(ValueError, match="does not update"):
        UpdateInBackward(AdamW(first.parameters()), [[*first.parameters(), second.weight]])
    with pytest.raises(TypeError, match="systems.optim.AdamW"):
        UpdateInBackward(torch.optim.SGD(first.parameters(), lr=0.1), [list(first.parameters())])
    with pytest.raises(ValueError, match="torch_adamw"):
        StepOptions(optimizer="torch_adamw", update_in_backward=True)


def test_second_backward_before_finish_is_an_error():
    first, second = _linear_pair()
    optimizer = AdamW([*first.parameters(), *second.parameters()], lr=0.1)
    UpdateInBackward(optimizer, [list(second.parameters()), list(first.parameters())])
    x = torch.randn(5, 4)
    second(first(x)).sum().backward()
    with pytest.raises(RuntimeError, match="second backward before finish"):
        second(first(x)).sum().backward()


@pytest.mark.gpu
def test_graphed_step_with_updates_in_backward_equals_plain_step():
    """Captured in a CUDA graph (fork to the side stream and join), replays train as the
    step after backward does."""
    def train(update_in_backward: bool) -> list[torch.Tensor]:
        workload = build_model_workload(
            get_config("tiny"), batch_size=2, seq_len=16, precision="bf16", compiled=True,
            device="cuda", seed=5,
            options=StepOptions(optimizer="mixed_precision", cuda_graph=True,
                                compile_scope="blocks", update_in_backward=update_in_backward))
        generator = torch.Generator().manual_seed(11)
        for _ in range(6):  # warm-up, capture, replays
            tokens = torch.randint(workload.config.vocab_size, (2, 2, 16), generator=generator)
            workload.load_batch(tokens[0].cuda(), tokens[1].cuda())
            workload.step()
        torch.cuda.synchronize()
        return [p.detach().cpu() for p in workload.model.parameters()]

    for a, b in zip(train(False), train(True), strict=True):
        assert torch.equal(a, b)
