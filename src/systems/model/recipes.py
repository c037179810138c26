"""Named training recipes: the plain step, the strongest PyTorch-only step, and ours.

A recipe fixes how one train step (forward, loss, backward, AdamW) runs; the step builder
in `systems.model.train_step` does the rest, so every recipe is built (and timed) the same
way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from systems.model.train_step import StepOptions, check_choice
from systems.optim import OptimizerName


@dataclass(frozen=True)
class Recipe:
    attention: str
    precision: str
    compiled: bool
    options: StepOptions


RECIPES: dict[str, Recipe] = {
    # The model as written: reference attention, our AdamW, bf16 autocast.
    "eager": Recipe("reference", "bf16", False, StepOptions()),
    # The strongest step PyTorch alone gives: SDPA (its own choice of fused kernel; causal,
    # no mask, so nothing rules the flash kernels out), the whole model compiled,
    # `torch.optim.AdamW(fused=True, capturable=True)`, and the whole step replayed from a
    # CUDA graph as ours is (CUDA only: elsewhere turn it off with cuda_graph=False).
    "pytorch_baseline": Recipe("sdpa", "bf16", True, StepOptions(
        optimizer=OptimizerName.TORCH_ADAMW, cuda_graph=True)),
    # Triton flash attention (a custom op inside the graph), the whole model compiled, bf16
    # parameters over fp32 masters updated by one fused kernel launch, LM head +
    # cross-entropy without full logits, and the whole step replayed from a CUDA graph (CUDA
    # only: elsewhere turn it off with cuda_graph=False).
    "optimized": Recipe("triton", "bf16", True, StepOptions(
        optimizer=OptimizerName.MIXED_PRECISION, fused_loss=True, cuda_graph=True)),
}
_OPTION_FIELDS = frozenset(f.name for f in fields(StepOptions))


def get_recipe(name: str, **overrides: object) -> Recipe:
    """The named recipe with some settings changed, e.g. `precision="fp32"`,
    `compiled=False` or any `StepOptions` field such as `checkpoint_every=4`."""
    base = RECIPES[check_choice("recipe", name, RECIPES)]
    options = {k: v for k, v in overrides.items() if k in _OPTION_FIELDS}
    top = {k: v for k, v in overrides.items() if k not in _OPTION_FIELDS}
    return replace(base, options=replace(base.options, **options), **top)


def runnable_on(recipe: Recipe, device: torch.device | str) -> Recipe:
    """`recipe` with its CUDA graph turned off where `device` is not a CUDA device (the
    builder refuses a CUDA graph there); everything else as it was."""
    if torch.device(device).type == "cuda" or not recipe.options.cuda_graph:
        return recipe
    return replace(recipe, options=replace(recipe.options, cuda_graph=False))
