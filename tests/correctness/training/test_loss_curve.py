"""Loss curves: 200 steps of the optimized recipe follow the fp32 reference recipe.

The data is fixed: sequences from a random Markov chain (each token has four equally likely
successors), a new batch every step, the same batches for every run, so the loss falls
towards the chain's entropy (log 4) as the model learns the transitions.

The tolerance is measured, not chosen: the same reference recipe restarted from other
seeds (other initial weights, same data) is the run-to-run difference training itself
has. The optimized curve must stay closer to the reference than every re-seeded fp32 run
does, over the whole curve (mean absolute difference per step), and its end (mean of the
last 50 steps) must not sit further above the reference's than a re-seeded run's end may
sit from it. That is tight enough to catch an update 10% too large or too small (tested
below).
"""

from __future__ import annotations

import pytest
import torch

from systems.bench.workloads import build_recipe_workload
from systems.model import MODEL_CONFIGS, ModelConfig
from systems.model.recipes import Recipe, get_recipe

STEPS = 200
TAIL = 50  # the curve's end: the last steps, averaged
OTHER_SEEDS = (1, 2)
LR = 3e-3  # the loss falls by more than half in 200 steps at this rate


def markov_batches(config: ModelConfig, steps: int, batch: int, seq: int,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(steps, batch, seq) inputs and next-token targets from a random Markov chain."""
    gen = torch.Generator().manual_seed(seed)
    successors = torch.randint(config.vocab_size, (config.vocab_size, 4), generator=gen)
    tokens = torch.empty(steps, batch, seq + 1, dtype=torch.int64)
    tokens[..., 0] = torch.randint(config.vocab_size, (steps, batch), generator=gen)
    for t in range(seq):
        choice = torch.randint(4, (steps, batch), generator=gen)
        tokens[..., t + 1] = successors[tokens[..., t], choice]
    return tokens[..., :-1], tokens[..., 1:]


def loss_curve(config: ModelConfig, recipe: Recipe, data: tuple[torch.Tensor, torch.Tensor],
               device: str, seed: int = 0) -> torch.Tensor:
    inputs, targets = data
    workload = build_recipe_workload(config, recipe, batch_size=inputs.shape[1],
                                     seq_len=inputs.shape[2], device=device, seed=seed)
    losses = []
    for step_inputs, step_targets in zip(inputs, targets, strict=True):
        workload.load_batch(step_inputs.to(device), step_targets.to(device))
        losses.append(workload.step().item())
    return torch.tensor(losses, dtype=torch.float64)


def assert_follows_reference(curve: torch.Tensor, reference: torch.Tensor,
                             reseeded: list[torch.Tensor]) -> None:
    assert reference[-TAIL:].mean() < reference[:10].mean() / 2  # it learned something
    distance = (curve - reference).abs().mean().item()
    seed_distances = [(other - reference).abs().mean().item() for other in reseeded]
    assert distance < min(seed_distances), (distance, seed_distances)
    excess = (curve[-TAIL:].mean() - reference[-TAIL:].mean()).item()
    seed_offsets = [abs((other[-TAIL:].mean() - reference[-TAIL:].mean()).item())
                    for other in reseeded]
    assert excess <= max(seed_offsets), (excess, seed_offsets)


def _reference_curves(config: ModelConfig, data, device: str
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The fp32 reference recipe's curve, and the same recipe's from the other seeds."""
    recipe = get_recipe("eager", precision="fp32", lr=LR)
    return (loss_curve(config, recipe, data, device),
            [loss_curve(config, recipe, data, device, seed=seed) for seed in OTHER_SEEDS])


CPU_CONFIG = MODEL_CONFIGS["tiny"].with_overrides(d_model=32, num_heads=2, d_ff=96,
                                                  vocab_size=256)


@pytest.fixture(scope="module")
def cpu_reference():
    data = markov_batches(CPU_CONFIG, STEPS, batch=4, seq=32)
    return data, *_reference_curves(CPU_CONFIG, data, "cpu")


@pytest.mark.slow
@pytest.mark.interpreter
def test_bf16_parameters_over_masters_and_fused_loss_follow_fp32_on_cpu(cpu_reference) -> None:
    """What of the optimized recipe runs on the CPU: bf16 parameters over fp32 masters
    (the fused AdamW kernel in Triton's interpreter, where fp32->bf16 truncates instead of
    rounding) and the chunked LM head + loss. SDPA stands in for the flash kernels (bf16
    dots are wrong in the interpreter); no compile, no CUDA graph. A small model keeps the
    interpreter's launches (one program per 4096 elements of each tensor) few."""
    data, reference, reseeded = cpu_reference
    optimized = get_recipe("optimized", attention="sdpa", compiled=False, cuda_graph=False,
                           lr=LR)
    assert optimized.precision == "bf16" and optimized.options.optimizer == "mixed_precision"
    assert optimized.options.fused_loss
    assert_follows_reference(loss_curve(CPU_CONFIG, optimized, data, "cpu"), reference,
                             reseeded)


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.9, 1.1])
def test_a_learning_rate_ten_percent_off_fails_the_check(cpu_reference, scale: float) -> None:
    """The tolerance is tight enough to see an optimizer that is slightly wrong: the
    reference recipe itself with its learning rate 10% off drifts further than re-seeding."""
    data, reference, reseeded = cpu_reference
    curve = loss_curve(CPU_CONFIG, get_recipe("eager", precision="fp32", lr=LR * scale), data,
                       "cpu")
    with pytest.raises(AssertionError):
        assert_follows_reference(curve, reference, reseeded)


@pytest.mark.gpu
def test_optimized_recipe_follows_fp32_on_gpu() -> None:
    """The real recipe: flash attention in Triton, the whole model compiled, bf16
    parameters over fp32 masters, the fused loss, every step after the warm-up replayed
    from one CUDA graph (new batches copied into the captured inputs)."""
    config = MODEL_CONFIGS["tiny"].with_overrides(d_model=256, num_heads=4, d_ff=768,
                                                  num_layers=4, vocab_size=2048)
    data = markov_batches(config, STEPS, batch=4, seq=128)
    reference, reseeded = _reference_curves(config, data, "cuda")
    assert_follows_reference(loss_curve(config, get_recipe("optimized", lr=LR), data, "cuda"),
                             reference, reseeded)


def test_a_curve_that_drifts_further_than_reseeding_fails() -> None:
    """The check itself: a curve offset by more than the seeds' spread is caught, one
    offset by less is not."""
    steps = torch.arange(STEPS, dtype=torch.float64)
    reference = 5.0 * torch.exp(-steps / 60) + 1.4
    reseeded = [reference + 0.05 * torch.sin(steps / 7 + k) for k in range(2)]
    assert_follows_reference(reference + 0.001, reference, reseeded)
    with pytest.raises(AssertionError):
        assert_follows_reference(reference + 0.06, reference, reseeded)
    with pytest.raises(AssertionError):  # the same distance, but all of it at the end
        assert_follows_reference(reference + torch.where(steps >= STEPS - TAIL, 0.06, 0.0),
                                 reference, reseeded)
