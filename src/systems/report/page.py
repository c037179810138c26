"""docs/RESULTS.md: per GPU, the newest result of every benchmark as tables and plots, then
the analytic accounting. Sections appear only when their data exists."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from systems.common.hardware import slugify
from systems.report import accounting_tables, claims, plots, tables
from systems.runs import keys
from systems.runs.history import Result, Run, latest_results, runs_by_device

_COMMAND = "python -m systems.report results"


def _section(title: str, body: str, note: str = "") -> list[str]:
    return [f"### {title}\n", *([note] if note else []), body, ""] if body else []


def _of_kind(results: Sequence[Result], kind: str) -> list[Result]:
    return [r for r in results if r.kind == kind]


def _measured(results: Sequence[Result], note: str = "", by: str | None = None) -> str:
    """A table's note: what it shows, what its times measure and which files they are from."""
    return note + tables.provenance(results, by)


def speedup_sections(results: Sequence[Result]) -> list[str]:
    """eager vs compiled, fp32 vs bf16, and reference attention vs every other one; each
    pair measured in one run."""
    e2e = _of_kind(results, "end_to_end")
    attention = _of_kind(results, "attention")
    model_label = [keys.SIZE, keys.SEQ_LEN, keys.MODE]
    out = _section("Speedup: eager vs torch.compile",
                   tables.speedup_table(e2e, keys.COMPILED, False, True,
                                        [*model_label, keys.PRECISION], ("eager", "compiled")),
                   _measured(e2e))
    out += _section("Speedup: fp32 vs bf16 autocast",
                    tables.speedup_table(e2e, keys.PRECISION, "fp32", "bf16",
                                         [*model_label, keys.COMPILED, keys.ATTENTION]),
                    _measured(e2e))
    for impl in sorted({str(r.get(keys.ATTENTION)) for r in e2e} - {"reference", "None"}):
        out += _section(f"Speedup: reference vs {impl} attention in the model",
                        tables.speedup_table(e2e, keys.ATTENTION, "reference", impl,
                                             [*model_label, keys.PRECISION]), _measured(e2e))
    for impl in sorted({str(r.get(keys.IMPLEMENTATION)) for r in attention} - {"reference"}):
        pairs = [r for r in attention if r.get(keys.IMPLEMENTATION) in ("reference", impl)]
        out += _section(f"Speedup: reference vs {impl} attention",
                        tables.speedup_table(attention, keys.IMPLEMENTATION, "reference", impl,
                                             [keys.PASS, keys.DTYPE, keys.BATCH_HEADS,
                                              keys.SEQ_LEN, keys.HEAD_DIM]),
                        _measured(pairs, by=keys.PASS))
    return out


def claims_section(results: Sequence[Result]) -> list[str]:
    return _section(
        "Claims: ours vs the rivals, same run",
        claims.claims_table(claims.all_claims(results)),
        "Each row is a ratio of medians of ours and a rival measured in the same run of the "
        "same history file (the newest run that measured both), never across runs; below 1 "
        "ours takes less time. The time column says what was timed: eager end-to-end "
        "includes the host (what a caller sees; below about 1 ms it is host-bound), device "
        "time is CUDA-graph replay or do_bench of the kernels alone. Where both were timed "
        "in do_bench rounds taken in turn, the medians are over the rounds and the ratio is "
        "the median of the rounds' own ratios, which can differ from the medians' ratio.\n")


def device_section(device: str, runs: Sequence[Run], img_dir: Path, page_dir: Path) -> list[str]:
    results = latest_results(runs)
    print(f"{device}: {len(runs)} runs, {len(results)} benchmarks", file=sys.stderr)
    lines = [f"## {device}\n",
             f"Newest result of each of {len(results)} benchmarks over {len(runs)} saved runs; "
             "a table of one measurement per row shows mean ± std over rounds; every ratio (the "
             "claims, speedups and recipes) is of medians, shown beside it; under each table, "
             "what its times measure and "
             "the history files they come from; the `run` column names the run of each "
             "number.\n"]
    lines += claims_section([r for run in runs for r in run.results])
    e2e = _of_kind(results, "end_to_end")
    lines += _section("End-to-end model steps (batch 4)", tables.end_to_end_table(results),
                      _measured(e2e))
    lines += _section("Peak memory: prediction vs measurement",
                      tables.memory_prediction_table(results),
                      _measured(e2e, "Prediction: `systems.accounting.step_memory` (eager, "
                                "reference attention), a lower bound that ignores transients. "))
    lines += _section("Training recipes: eager vs PyTorch-only baseline vs ours",
                      tables.recipes_table(results),
                      _measured(_of_kind(results, "recipe"),
                                "Train steps (forward, loss, backward, AdamW; batch 4, bf16) "
                                "of the recipes in `systems.bench.recipes`, side by side when "
                                "measured in one run; times and speedups are medians; cold s: "
                                "the first step alone, compilation and autotuning included. ",
                                keys.RECIPE))
    lines += speedup_sections(results)
    lines += _section("Warm-up study", tables.warmup_study_table(results),
                      _measured(_of_kind(results, "warmup_study"),
                                "Without warm-up the first steps (allocator growth, cuBLAS "
                                "heuristics, compilation) land in the timed rounds: watch the "
                                "mean and max. "))
    lines += _section("Attention", tables.attention_table(results),
                      _measured(_of_kind(results, "attention"), by=keys.PASS))
    lines += _section("Data-parallel training", tables.ddp_table(results),
                      _measured(_of_kind(results, "ddp")))
    lines += _section("Collectives", tables.collective_table(results),
                      _measured(_of_kind(results, "collective")))
    figures = (
        ("Attention time and memory vs sequence length", plots.attention_scaling, "attention"),
        ("Model step time by size and precision", plots.model_step_times, "model_steps"),
        ("DDP variants and bucket sweep", plots.ddp_variants, "ddp"),
        ("All-reduce bandwidth vs size", plots.allreduce_bandwidth, "allreduce"),
    )
    for title, plot, name in figures:
        print(f"  plotting {name} ...", file=sys.stderr)
        path = plot(results, img_dir / f"{slugify(device)}_{name}.png")
        if path is not None:
            lines += [f"### {title}\n", f"![{title}]({path.relative_to(page_dir).as_posix()})\n"]
    return lines


def accounting_section() -> list[str]:
    return [
        "## Analytic accounting (`systems.accounting`)\n",
        *_section(f"Memory of our models (batch {accounting_tables.BATCH}, "
                  f"ctx {accounting_tables.CONTEXT})", accounting_tables.config_memory_table(),
                  "Peak = max(params + AdamW + activations at backward start, params + grads "
                  "+ AdamW + its sqrt(v) buffer at the optimizer step).\n"),
        *_section("Activation checkpointing (fp32, ctx 512)",
                  accounting_tables.checkpointing_table(),
                  "Keeping every segment-th block input and recomputing one segment at a "
                  "time in backward.\n"),
        *_section("The XXL FFN model and FSDP", accounting_tables.xxl_table(),
                  "FSDP shards the fp32 state and half the activations; the other half "
                  "stays replicated.\n"),
        *_section("Data-parallel communication per step", accounting_tables.communication_table(),
                  "Bytes each rank sends (ring collectives) for fp32 gradients/parameters.\n"),
    ]


def results_page(runs: Sequence[Run], out_dir: Path, img_dir: Path) -> str:
    """The whole page; plots are written under `img_dir` and linked relative to `out_dir`."""
    lines = ["# Results\n",
             f"Generated by `{_COMMAND}` from the saved runs under `.benchmarks/`; do not edit "
             "by hand. Histories are per GPU model: numbers from different GPUs are never "
             "mixed.\n"]
    by_device = runs_by_device(runs)
    if not by_device:
        lines.append("No saved benchmark runs yet: run `make bench` on a GPU, commit "
                     "`.benchmarks/`, then regenerate this page.\n")
    for device, device_runs in sorted(by_device.items()):
        lines += device_section(device, device_runs, img_dir, out_dir)
    lines += accounting_section()
    return "\n".join(lines).rstrip() + "\n"
