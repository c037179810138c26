"""Markdown tables of benchmark results for the results page: training recipes and
data-parallel steps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from systems.common.formatting import fmt, markdown_table
from systems.model import MODEL_CONFIGS
from systems.runs import keys
from systems.runs.history import Result

_SIZE_ORDER = {name: i for i, name in enumerate(MODEL_CONFIGS)}


def provenance(results: Sequence[Result], by: str | None = None) -> str:
    """What a table's times measure and which history files (and runs) they come from;
    where the kinds differ, `by` (an extra_info key) names the rows of each kind."""
    kinds: dict[str, set[str]] = {}
    for r in results:
        kinds.setdefault(r.time_kind, set()).add(str(r.get(by)) if by else "")
    times = "; ".join(f"{', '.join(sorted(names))}: {kind}" if by and len(kinds) > 1 else kind
                      for kind, names in sorted(kinds.items()))
    sources = sorted({r.file if r.run == Path(r.file).name else f"{r.file} (measured in {r.run})"
                      for r in results})
    return (f"Time: {times}. From: {', '.join(f'`{s}`' for s in sources)}.\n"
            if results else "")


def _gib(value: object) -> str:
    return fmt(value, ".2f", 2**-30)


def recipes_table(results: Sequence[Result], baseline: str = "pytorch_baseline",
                  contender: str = "optimized", plain: str = "eager") -> str:
    """Per model size and context: the three training recipes side by side, the speedups of
    `contender` over `baseline` and over `plain` (ratios of medians), and cold starts (first
    step, compiling)."""
    by_workload: dict[tuple, dict[str, Result]] = {}
    for r in results:  # recipes are put side by side only when measured in one run
        if r.kind == "recipe":
            by_workload.setdefault((r.get(keys.SIZE), r.get(keys.SEQ_LEN), r.measured_in), {})[
                str(r.get(keys.RECIPE))] = r
    rows = []
    for (size, context, _), recipes in sorted(
            by_workload.items(), key=lambda item: (_SIZE_ORDER.get(item[0][0], 99), str(item[0]))):
        if (ours := recipes.get(contender)) is None:
            continue
        base, eager = recipes.get(baseline), recipes.get(plain)
        rows.append([
            size, context, *(f"{r.median * 1e3:.2f}" if r else "-" for r in (eager, base, ours)),
            *(f"{r.median / ours.median:.2f}x" if r else "-" for r in (base, eager)),
            fmt(ours.get(keys.MFU), ".1%"),
            *(fmt(r.get(keys.COLD_START_S), ".1f") if r else "-" for r in (base, ours)),
            _gib(ours.get(keys.PEAK_MEMORY)), ours.short_run])
    return markdown_table(
        ["size", "ctx", f"{plain} median ms", f"{baseline} median ms", f"{contender} median ms",
         f"vs {baseline}", f"vs {plain}", f"{contender} MFU", f"{baseline} cold s",
         f"{contender} cold s", f"{contender} peak GiB", "run"], rows)


_SAME_TRAINING = (keys.SIZE, keys.BATCH_PER_RANK, keys.SEQ_LEN, keys.WORLD_SIZE, keys.BACKEND)


def overhead_vs_no_comm(result: Result, results: Sequence[Result]) -> float | None:
    """The step's time over that of each rank training alone (variant "none") on the same
    model, batch and world size, measured in the same run, minus 1; the value a run saved
    itself where it has no such case."""
    alone = [r for r in results if r.get(keys.VARIANT) == "none"
             and r.measured_in == result.measured_in
             and all(r.get(k) == result.get(k) for k in _SAME_TRAINING)]
    step = result.get(keys.STEP_S)
    if alone and isinstance(step, int | float) and alone[0].get(keys.STEP_S):
        return step / alone[0].get(keys.STEP_S) - 1
    return result.get(keys.OVERHEAD_VS_NO_COMM)


def _ddp_order(r: Result) -> tuple:
    """World size, variant, bucket and optimizer; a missing value sorts last."""
    return tuple((0, v) if isinstance(v, str) else (v is None, v or 0) for v in (
        r.get(k) for k in (keys.WORLD_SIZE, keys.VARIANT, keys.BUCKET_SIZE_MB, keys.OPTIMIZER)))


def ddp_table(results: Sequence[Result]) -> str:
    rows = sorted((r for r in results if r.kind == "ddp"), key=_ddp_order)
    return markdown_table(
        ["variant", "optimizer", "world size", "bucket MB", "step ms (slowest rank, median)",
         "vs no communication", "waiting after backward", "peak GiB", "run"],
        [[r.get(keys.VARIANT), r.get(keys.OPTIMIZER, "-"), r.get(keys.WORLD_SIZE, "-"),
          r.get(keys.BUCKET_SIZE_MB, "-"), fmt(r.get(keys.STEP_S), ".1f", 1e3),
          fmt(overhead_vs_no_comm(r, results), "+.1%"),
          fmt(r.get(keys.SYNC_WAIT_FRACTION), ".1%"), _gib(r.get(keys.PEAK_MEMORY)),
          r.short_run] for r in rows])
