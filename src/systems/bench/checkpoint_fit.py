"""How many blocks a recipe's train step recomputes so that it fits on its GPU.

The analytic model (`accounting.checkpoint_blocks_for_budget`) counts what the eager model
saves for backward, which a compiled step undercuts by a wide margin (2.7b, ctx 2048: about
1.5 GiB a block counted, 0.8 to 1.1 GiB measured, by recipe). Where even that count fits
with nothing recomputed, nothing is. Otherwise the recipe's own step is measured at two
small depths of the model's width, and its peak memory extrapolated to the model's depth
(`PeakModel`): each recipe then recomputes the fewest blocks its own step needs, where one
count for all recomputed as many blocks in every recipe as the eager model would need.

The measured line is kept in `$SYSTEMS_CACHE_DIR` (default `~/.cache/systems`), keyed by the
GPU model, PyTorch, the recipe, the model's shape and the package's own source, so that a
later run of the same code on the same GPU model fits its steps without compiling and
running the three probe steps again.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

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


def _package_digest() -> str:
    """A hash of this package's Python source: a measured line holds for this code only."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def peak_model_cache() -> Path:
    root = os.environ.get("SYSTEMS_CACHE_DIR") or Path.home() / ".cache" / "systems"
    return Path(root) / "checkpoint_fit.json"


def _read_entries(cache: Path) -> dict:
    try:
        entries = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def cached_peak_model(identity: list[object], measure: Callable[[], PeakModel],
                      cache: Path | None = None) -> tuple[PeakModel, bool]:
    """The line measured for `identity` before (read from `cache`), else `measure()` kept
    there; and whether it came from the cache. An unreadable cache is measured anew."""
    cache = cache or peak_model_cache()
    key = hashlib.sha256(json.dumps([*identity, _package_digest()], default=str)
                         .encode()).hexdigest()
    entries = _read_entries(cache)
    try:
        return PeakModel(**entries[key]), True
    except (KeyError, TypeError):
        pass
    model = measure()
    entries[key] = asdict(model)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        scratch = cache.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(entries))
        scratch.replace(cache)  # whole, so that a concurrent reader never sees half a file
    except OSError as error:
        print(f"could not keep the measured peak-memory line in {cache}: {error}",
              file=sys.stderr)
    return model, False


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
        identity = [torch.__version__, torch.cuda.get_device_name(device),
                    torch.cuda.get_device_properties(device).total_memory, repr(recipe),
                    repr(config), batch_size, seq_len, PROBE_DEPTH]
        model, cached = cached_peak_model(
            identity, lambda: measure_peak_model(recipe, config, batch_size, seq_len, device))
        where = (f"kept in {peak_model_cache()}" if cached else
                 f"measured at {PROBE_DEPTH // 2} and {PROBE_DEPTH} blocks")
        print(f"the step's peak-memory line {where} (the analytic count would recompute "
              f"{blocks} of {config.num_layers})", file=sys.stderr)
        blocks = model.fewest_recomputed(config.num_layers, budget - allocated)
        predicted = allocated + model.predict(config.num_layers, blocks)
        print(f"recomputing {blocks} of {config.num_layers} blocks: predicted peak "
              f"{predicted / 2**30:.1f} GiB of a {budget / 2**30:.1f} GiB budget",
              file=sys.stderr)
    return Fit(replace(recipe, options=replace(recipe.options, checkpoint_blocks=blocks)),
               predicted)
