"""docs/RESULTS.md: per GPU, the claims and plots, then a table per topic that has data."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from systems.common.formatting import fmt, markdown_table
from systems.common.hardware import slugify
from systems.runs import keys
from systems.runs.history import Result, Run, latest_results, load_runs, runs_by_device
from systems.runs.validate import check_writable_folder
from tools.docgen import claims
from tools.docgen import results_plots as plots


def provenance(results: Sequence[Result], by: str | None = None) -> str:
    """What a table's times measure (per value of `by` where they differ) and their files."""
    kinds: dict[str, set[str]] = {}
    for r in results:
        kinds.setdefault(r.time_kind, set()).add(str(r.get(by)) if by else "")
    times = "; ".join(f"{', '.join(sorted(names))}: {kind}" if by and len(kinds) > 1 else kind
                      for kind, names in sorted(kinds.items()))
    sources = sorted({r.file if r.run == Path(r.file).name else f"{r.file} (measured in {r.run})"
                      for r in results})
    return (f"Time: {times}. From: {', '.join(f'`{s}`' for s in sources)}.\n"
            if results else "")


def recipes_table(results: Sequence[Result]) -> str:
    """Per size and context, the recipes of one run side by side: speedups and cold starts."""
    contender, baseline, plain = claims.OUR_RECIPE, claims.RIVAL_RECIPE, "eager"
    by_workload: dict[tuple, dict[str, Result]] = {}
    for r in results:  # recipes are put side by side only when measured in one run
        if r.kind == "recipe":
            by_workload.setdefault((r.get(keys.SIZE), r.get(keys.SEQ_LEN), r.measured_in), {})[
                str(r.get(keys.RECIPE))] = r
    rows = []
    for (size, context, _), recipes in sorted(
            by_workload.items(), key=lambda item: (plots.size_order(item[0][0]), str(item[0]))):
        if (ours := recipes.get(contender)) is None:
            continue
        base, eager = recipes.get(baseline), recipes.get(plain)
        rows.append([
            size, context, *(f"{r.median * 1e3:.2f}" if r else "-" for r in (eager, base, ours)),
            *(f"{r.median / ours.median:.2f}x" if r else "-" for r in (base, eager)),
            fmt(ours.get(keys.MFU), ".1%"),
            *(fmt(r.get(keys.COLD_START_S), ".1f") if r else "-" for r in (base, ours)),
            fmt(ours.get(keys.PEAK_MEMORY), ".2f", 2**-30), ours.short_run])
    return markdown_table(
        ["size", "ctx", f"{plain} median ms", f"{baseline} median ms", f"{contender} median ms",
         f"vs {baseline}", f"vs {plain}", f"{contender} MFU", f"{baseline} cold s",
         f"{contender} cold s", f"{contender} peak GiB", "run"], rows)


_SAME_TRAINING = (keys.SIZE, keys.BATCH_PER_RANK, keys.SEQ_LEN, keys.WORLD_SIZE, keys.BACKEND)


def overhead_vs_no_comm(result: Result, results: Sequence[Result]) -> float | None:
    """The step over the same run's variant "none" (ranks alone), minus 1; else as saved."""
    alone = [r for r in results if r.get(keys.VARIANT) == "none"
             and r.measured_in == result.measured_in
             and all(r.get(k) == result.get(k) for k in _SAME_TRAINING)]
    step = result.get(keys.STEP_S)
    if alone and isinstance(step, int | float) and alone[0].get(keys.STEP_S):
        return step / alone[0].get(keys.STEP_S) - 1
    return result.get(keys.OVERHEAD_VS_NO_COMM)


def _ddp_order(r: Result) -> tuple:
    return tuple((0, v) if isinstance(v, str) else (v is None, v or 0) for v in (  # None last
        r.get(k) for k in (keys.WORLD_SIZE, keys.VARIANT, keys.BUCKET_SIZE_MB, keys.OPTIMIZER)))


def ddp_table(results: Sequence[Result]) -> str:
    rows = sorted((r for r in results if r.kind == "ddp"), key=_ddp_order)
    return markdown_table(
        ["variant", "optimizer", "world size", "bucket MB", "step ms (slowest rank, median)",
         "vs no communication", "waiting after backward", "peak GiB", "run"],
        [[r.get(keys.VARIANT), r.get(keys.OPTIMIZER, "-"), r.get(keys.WORLD_SIZE, "-"),
          r.get(keys.BUCKET_SIZE_MB, "-"), fmt(r.get(keys.STEP_S), ".1f", 1e3),
          fmt(overhead_vs_no_comm(r, results), "+.1%"),
          fmt(r.get(keys.SYNC_WAIT_FRACTION), ".1%"), fmt(r.get(keys.PEAK_MEMORY), ".2f", 2**-30),
          r.short_run] for r in rows])


def _section(title: str, body: str, note: str = "") -> list[str]:
    return [f"### {title}\n", *([note] if note else []), body, ""] if body else []


_CLAIMS_NOTE = (
    "Each claim is a ratio of medians of ours and a rival measured in the same run of the "
    "same history file (the newest run that measured both), never across runs; below 1 ours "
    "takes less time. A row gathers the claims of one comparison and one kind of time: eager "
    "end-to-end includes the host (what a caller sees; below about 1 ms it is host-bound), "
    "device time is CUDA-graph replay or do_bench of the kernels alone. Per-shape tables: "
    "docs/attention.md, docs/training_recipes.md, docs/distributed_notes.md.\n")
_RECIPES_NOTE = (
    "Train steps (forward, loss, backward, AdamW; batch 4, bf16) of the recipes in "
    "`systems.model.recipes`, side by side when measured in one run; times and speedups are "
    "medians; cold s: the first step alone, compilation and autotuning included. ")
# (title, plot, file name, whether it picks one run among all of them, not the newest results)
_FIGURES = (
    ("Attention: achieved TFLOP/s against sequence length (device time)",
     plots.attention_device, "attention_device", True),
    ("Attention: eager forward + backward at batch 1 (what a caller sees)",
     plots.attention_eager, "attention_eager", True),
    ("Train step per recipe, beside its floor", plots.train_step_recipes, "train_step", True),
    ("Model step time by size and precision", plots.model_step_times, "model_steps", False),
    ("DDP variants and bucket sweep", plots.ddp_variants, "ddp", False),
    ("All-reduce bandwidth vs size", plots.allreduce_bandwidth, "allreduce", False),
)


def device_section(device: str, runs: Sequence[Run], img_dir: Path, page_dir: Path) -> list[str]:
    """A GPU's claims, figures and topic tables (these from the newest results)."""
    every = [r for run in runs for r in run.results]
    latest = latest_results(runs)
    print(f"{device}: {len(runs)} runs, {len(latest)} benchmarks", file=sys.stderr)
    lines = [f"## {device}\n",
             f"{len(runs)} saved runs of {len(latest)} benchmarks. The newest result of each: "
             f"`systems report latest --gpu \"{device}\"`; two runs side by side: "
             "`systems report compare OLD NEW`.\n",
             *_section("Claims: ours vs the rivals, same run",
                       claims.summary_table(claims.all_claims(every)), _CLAIMS_NOTE)]
    for title, plot, name, one_run in _FIGURES:
        print(f"  plotting {name} ...", file=sys.stderr)
        path = plot(every if one_run else latest, img_dir / f"{slugify(device)}_{name}.png")
        if path is not None:
            lines += [f"### {title}\n", f"![{title}]({path.relative_to(page_dir).as_posix()})\n"]

    recipes, ddp = ([r for r in latest if r.kind == kind] for kind in ("recipe", "ddp"))
    return [*lines, *_section("Training recipes: eager vs PyTorch-only baseline vs ours",
                              recipes_table(latest), _RECIPES_NOTE + provenance(recipes, "recipe")),
            *_section("Data-parallel training", ddp_table(latest), provenance(ddp))]


def results_page(runs: Sequence[Run], out_dir: Path, img_dir: Path) -> str:
    """The page, linking the plots it writes under `img_dir` relative to `out_dir`."""
    lines = ["# Results\n",
             "Generated by `python -m tools.docgen --results` (`make report`) from the saved "
             "runs under `.benchmarks/`; do not edit by hand. Histories are per GPU model: "
             "numbers from different GPUs are never mixed, and a ratio is only formed within "
             "one run.\n"]
    for device, device_runs in sorted(runs_by_device(runs).items()):
        lines += device_section(device, device_runs, img_dir, out_dir)
    return "\n".join(lines).rstrip() + "\n"


def write_results_page(root: Path, out: Path, include_cpu: bool = False) -> str:
    """Write the page and its plots (in <out's folder>/img), or raise before writing."""
    runs = [r for r in load_runs(root) if include_cpu or not r.device.lower().startswith("cpu")]
    if not any(run.results for run in runs):
        raise ValueError(f"no usable saved runs under {root}"
                         f"{'' if include_cpu else ' (CPU runs are left out)'}: "
                         "nothing to report, no page written")
    img = out.parent / "img"
    for folder in (out.parent, img):  # before the plots are drawn, not after
        check_writable_folder(folder)
    out.write_text(results_page(runs, out.parent, img))
    return f"wrote {out} ({len(runs)} runs)"
