"""How many blocks a recipe's train step recomputes so that it fits on its GPU.

The analytic model (`accounting.checkpoint_blocks_for_budget`) counts what the eager model
saves for backward, which a compiled step undercuts by a wide margin (2.7b, ctx 2048: about
1.5 GiB a block counted, 0.8 to 1.1 GiB measured, by recipe). Where even that count fits
with nothing recomputed, nothing is. Otherwise the recipe's own step is measured at two
small depths of the model's width, and its peak memory extrapolated to the model's depth
(`PeakModel`): each recipe then recomputes the fewest blocks its own step needs, where one
count for all recomputed as many blocks in every recipe as the eager model would need.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, replace

import torch

from systems.accounting import checkpoint_blocks_for_budget
from systems.attention.registry import saves_scores
from systems.bench.workloads import build_recipe_workload
from systems.model import ModelConfig
from systems.model.recipes import Recipe
from systems.model.train_step import CUDA_GRAPH_WARMUP

BUDGET_SHARE = 0.9  # of the GPU's memory; the rest is allocator slack and transients
PROBE_DEPTH = 4  # blocks of the deepest measured step; the shallow one has half as many


@dataclass(frozen=True)
class PeakModel:
    """A train step's peak memory as a straight line in its depth and in the number of
    recomputed blocks, through three measured steps of `depth // 2` and `depth` blocks.

    Each block adds its parameters, gradients, optimizer state and saved activations
    (`per_block`); each recomputed block gives back its saved activations less the input
    it keeps (`recompute_saving`). Both hold while the peak is the start of backward,
    where every block's activations are alive, which is where a deep model's peak lies.
    """

    depth: int
    peak: int  # bytes, the deeper step with nothing recomputed
    per_block: int
    recompute_saving: int

    def predict(self, num_layers: int, recomputed: int) -> int:
        """Peak bytes of the step with `num_layers` blocks and the first `recomputed` of
        them recomputed."""
        return (self.peak + (num_layers - self.depth) * self.per_block
                - recomputed * self.recompute_saving)

    def fewest_recomputed(self, num_layers: int, budget: int) -> int:
        """The fewest recomputed blocks whose predicted peak fits in `budget` bytes; every
        block when none fits."""
        for recomputed in range(num_layers + 1):
            if self.predict(num_layers, recomputed) <= budget:
                return recomputed
        return num_layers


def step_peak(recipe: Recipe, config: ModelConfig, batch_size: int, seq_len: int,
              device: torch.device, recomputed: int) -> int:
    """Peak bytes allocated while `config` is built and trained by `recipe` (with its first
    `recomputed` blocks recomputed) for a few steps, as a perf case runs it: the first step
    compiles and creates the optimizer's state, and a graphed recipe's are captured and
    replayed. Counted above what was allocated before."""
    options = replace(recipe.options, checkpoint_every=0, checkpoint_blocks=recomputed)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    workload = build_recipe_workload(config, replace(recipe, options=options),
                                     batch_size=batch_size, seq_len=seq_len, device=device)
    for _ in range(CUDA_GRAPH_WARMUP + 2):
        workload.step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del workload
    gc.collect()
    torch.cuda.empty_cache()
    return peak


def measure_peak_model(recipe: Recipe, config: ModelConfig, batch_size: int, seq_len: int,
                       device: torch.device, depth: int = PROBE_DEPTH) -> PeakModel:
    """Three runs of `config`'s width at `depth // 2` and `depth` blocks (the deeper one
    also with half its blocks recomputed), each run as the recipe says (`step_peak`)."""
    if depth < 2 or depth % 2:
        raise ValueError(f"depth must be an even number >= 2, got {depth}")
    half = depth // 2

    def peak(layers: int, recomputed: int) -> int:
        return step_peak(recipe, replace(config, num_layers=layers), batch_size, seq_len,
                         device, recomputed)

    shallow, deep, partly_recomputed = peak(half, 0), peak(depth, 0), peak(depth, half)
    return PeakModel(depth=depth, peak=deep, per_block=(deep - shallow) // half,
                     recompute_saving=max(0, (deep - partly_recomputed) // half))


@dataclass(frozen=True)
class Fit:
    """A recipe fitted to a GPU, and the peak the measured line predicts for its step, in
    bytes allocated on the device (None where nothing was measured: off CUDA, a recipe that
    sets its own checkpointing, or a step the analytic count already fits)."""

    recipe: Recipe
    predicted_peak_bytes: int | None = None


def fit_to_device(recipe: Recipe, config: ModelConfig, batch_size: int, seq_len: int,
                  device: torch.device | str) -> Fit:
    """`recipe` recomputing the fewest blocks (`checkpoint_blocks`) with which its step fits
    in `BUDGET_SHARE` of the GPU's memory, beside what is allocated already. A recipe that
    sets either checkpointing option keeps it, and off CUDA nothing changes."""
    device = torch.device(device)
    chosen = recipe.options.checkpoint_every or recipe.options.checkpoint_blocks
    if device.type != "cuda" or chosen:
        return Fit(recipe)
    allocated = torch.cuda.memory_allocated(device)
    budget = int(BUDGET_SHARE * torch.cuda.get_device_properties(device).total_memory)
    blocks = checkpoint_blocks_for_budget(config, batch_size, seq_len, recipe.precision,
                                          budget - allocated, saves_scores(recipe.attention))
    predicted = None
    if blocks and config.num_layers > PROBE_DEPTH:
        print(f"measuring the step's peak memory at {PROBE_DEPTH // 2} and {PROBE_DEPTH} "
              f"blocks (the analytic count would recompute {blocks} of "
              f"{config.num_layers}) ...", file=sys.stderr)
        model = measure_peak_model(recipe, config, batch_size, seq_len, device)
        blocks = model.fewest_recomputed(config.num_layers, budget - allocated)
        predicted = allocated + model.predict(config.num_layers, blocks)
        print(f"recomputing {blocks} of {config.num_layers} blocks: predicted peak "
              f"{predicted / 2**30:.1f} GiB of a {budget / 2**30:.1f} GiB budget",
              file=sys.stderr)
    return Fit(replace(recipe, options=replace(recipe.options, checkpoint_blocks=blocks)),
               predicted)
