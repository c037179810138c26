"""Train steps (forward, loss, backward, AdamW) of the three training recipes.

`eager`: the model as written; `pytorch_baseline`: the strongest PyTorch-only step;
`optimized`: ours (see `systems.model.recipes` and docs/training_recipes.md). Every case
records `recipe` and `cold_start_s` (the first step, compilation included) in extra_info.
Profiles: `smoke` (tiny, CPU, no compile, no CUDA graph), `quick` (every recipe for 2.7b and
small at ctx 512: the regression baseline, a few minutes on one H100), `full` (every size
at ctx 512 and 2048; select parts with -k; with them, the 2.7b ctx 2048 step of ours on
the two-pass attention kernels). Every recipe gets activation checkpointing by the same
rule (`systems.bench.checkpoint_fit`): the fewest recomputed blocks with which its own step
fits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from systems.bench.checkpoint_fit import fit_to_device
from systems.bench.workloads import build_recipe_workload
from systems.model import get_config
from systems.model.recipes import RECIPES, get_recipe
from systems.model.train_step import CUDA_GRAPH_WARMUP
from systems.runs import keys

SIZES = ("small", "medium", "large", "xl", "2.7b")
SEQ_LENS = (512, 2048)


@dataclass(frozen=True)
class RecipeCase:
    size: str
    seq_len: int
    recipe: str
    overrides: tuple[tuple[str, object], ...] = ()
    warmup: int = 2
    rounds: int = 5
    batch: int = 4

    @property
    def id(self) -> str:
        return "-".join([f"{self.size}-ctx{self.seq_len}-{self.recipe}",
                         *(f"{k}={v}" for k, v in self.overrides)])


def _warmup(recipe: str) -> int:
    """Untimed rounds after the cold start (the first call): a graphed step needs just
    enough for its capture to happen before the timed rounds, which are then all replays;
    compiled graphs settle over a few steps; eager steps need one more for the allocator."""
    options = RECIPES[recipe]
    if options.options.cuda_graph:
        return CUDA_GRAPH_WARMUP
    return 3 if options.compiled else 2


def _rounds(size: str) -> int:
    """A graphed step's rounds are replays (device time); an eager step's are wall time,
    gated on the device clock recorded beside them, so they need no more rounds."""
    return 10 if size in ("small", "medium") else 5


def _case(size: str, seq_len: int, recipe: str) -> RecipeCase:
    return RecipeCase(size, seq_len, recipe, warmup=_warmup(recipe), rounds=_rounds(size))


def perf_cases(profile: str) -> list[RecipeCase]:
    if profile == "smoke":  # Triton's interpreter runs fp32, and a CPU compile takes ~15 s
        cpu_only = (("precision", "fp32"), ("compiled", False), ("cuda_graph", False))
        return [RecipeCase("tiny", 64, recipe, cpu_only, warmup=1, rounds=3)
                for recipe in RECIPES]
    if profile == "full":
        # Beside them, ours at 2.7b ctx 2048 (heads of d = 80) with the two-pass kernels
        # whatever the attention dispatch picks: what the dispatch buys in a whole step.
        two_pass = replace(_case("2.7b", 2048, "optimized"),
                           overrides=(("attention", "triton_two_pass"),))
        return [*(_case(*combo) for combo in itertools.product(SIZES, SEQ_LENS, RECIPES)),
                two_pass]
    # xl at ctx 512 and every ctx 2048 step are left to `full`: the same code as 2.7b and
    # small at ctx 512, and their compiles cost the baseline minutes of GPU time per run.
    return [_case(size, 512, recipe) for size in ("2.7b", "small") for recipe in RECIPES]


def test_training_recipe(perf_case: RecipeCase, device, synced_benchmark) -> None:
    config = get_config(perf_case.size)
    fit = fit_to_device(get_recipe(perf_case.recipe, **dict(perf_case.overrides)), config,
                        perf_case.batch, perf_case.seq_len, device)
    recipe = fit.recipe
    workload = build_recipe_workload(config, recipe, batch_size=perf_case.batch,
                                     seq_len=perf_case.seq_len, device=device)
    # Beside the measured peak, what the checkpointing rule predicted (where it measured).
    predicted = ({} if fit.predicted_peak_bytes is None else
                 {keys.PREDICTED_PEAK_MEMORY: fit.predicted_peak_bytes})
    synced_benchmark.benchmark.group = f"recipes-{perf_case.size}-ctx{perf_case.seq_len}"
    synced_benchmark(
        workload.step, warmup=perf_case.warmup, rounds=perf_case.rounds,
        precision=recipe.precision, flops=workload.flops, tokens=workload.tokens,
        info={"size": perf_case.size, "recipe": perf_case.recipe, **workload.describe(),
              **predicted},
        cold_start=True,
    )
