"""docs/RESULTS.md: per GPU, the newest result of every benchmark as tables and plots, then
the analytic accounting. Sections appear only when their data exists."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from systems.bench.hardware import slugify
from systems.report import accounting_tables, keys, plots, tables
from systems.report.history import Result, Run, latest_results, runs_by_device

_COMMAND = "python -m systems.report results"


def _section(title: str, body: str, note: str = "") -> list[str]:
    return [f"### {title}\n", *([note] if note else []), body, ""] if body else []


def speedup_sections(results: Sequence[Result]) -> list[str]:
    """eager vs compiled, fp32 vs bf16, and reference attention vs every other one."""
    e2e = [r for r in results if r.kind == "end_to_end"]
    attention = [r for r in results if r.kind == "attention"]
    model_label = [keys.SIZE, keys.CONTEXT, keys.MODE]
    out = _section("Speedup: eager vs torch.compile",
                   tables.speedup_table(e2e, keys.COMPILED, False, True,
                                        [*model_label, keys.PRECISION], ("eager", "compiled")))
    out += _section("Speedup: fp32 vs bf16 autocast",
                    tables.speedup_table(e2e, keys.PRECISION, "fp32", "bf16",
                                         [*model_label, keys.COMPILED, keys.ATTENTION]))
    for impl in sorted({str(r.get(keys.ATTENTION)) for r in e2e} - {"reference", "None"}):
        out += _section(f"Speedup: reference vs {impl} attention in the model",
                        tables.speedup_table(e2e, keys.ATTENTION, "reference", impl,
                                             [*model_label, keys.PRECISION]))
    for impl in sorted({str(r.get(keys.IMPLEMENTATION)) for r in attention} - {"reference"}):
        out += _section(f"Speedup: reference vs {impl} attention",
                        tables.speedup_table(attention, keys.IMPLEMENTATION, "reference", impl,
                                             [keys.PASS, keys.DTYPE, keys.BATCH_HEADS,
                                              keys.SEQ_LEN, keys.HEAD_DIM]))
    return out


def device_section(device: str, runs: Sequence[Run], img_dir: Path, page_dir: Path) -> list[str]:
    results = latest_results(runs)
    print(f"{device}: {len(runs)} runs, {len(results)} benchmarks", file=sys.stderr)
    lines = [f"## {device}\n",
             f"Newest result of each of {len(results)} benchmarks over {len(runs)} saved runs "
             f"(runs: {', '.join(r.path.name for r in runs)}); times are mean ± std over "
             "rounds; the `run` column names the file each number comes from.\n"]
    lines += _section("End-to-end model steps (batch 4)", tables.end_to_end_table(results))
    lines += _section("Peak memory: prediction vs measurement",
                      tables.memory_prediction_table(results),
                      "Prediction: `systems.accounting.step_memory` (eager, reference "
                      "attention), a lower bound that ignores transients.\n")
    lines += _section("Training recipes: eager vs PyTorch-only baseline vs ours",
                      tables.recipes_table(results),
                      "Train steps (forward, loss, backward, AdamW; batch 4, bf16) of the "
                      "recipes in `systems.bench.recipes`; speedups are ratios of means; "
                      "cold s: the first step alone, compilation and autotuning included.\n")
    lines += speedup_sections(results)
    lines += _section("Warm-up study", tables.warmup_study_table(results),
                      "Without warm-up the first steps (allocator growth, cuBLAS heuristics, "
                      "compilation) land in the timed rounds: watch the mean and max.\n")
    lines += _section("Attention", tables.attention_table(results))
    lines += _section("Data-parallel training", tables.ddp_table(results))
    lines += _section("Collectives", tables.collective_table(results))
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
