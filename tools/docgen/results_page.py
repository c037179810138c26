"""docs/RESULTS.md: per GPU, the claims (ours against the rivals, same run) and the plots
first, then one compact table per topic. Sections appear only when their data exists.
Every case's newest result is `systems report latest`.

    python -m tools.docgen --results             # this page and docs/img/*.png, then the blocks
    python -m tools.docgen.results_page --root .benchmarks --out docs/RESULTS.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from systems.common.cli_help import HelpFormatter
from systems.common.hardware import slugify
from systems.runs.history import Result, Run, latest_results, load_runs, runs_by_device
from systems.runs.validate import check_writable_folder
from tools.docgen import claims
from tools.docgen import results_plots as plots
from tools.docgen import results_tables as tables

_COMMAND = "python -m tools.docgen --results"


def _section(title: str, body: str, note: str = "") -> list[str]:
    return [f"### {title}\n", *([note] if note else []), body, ""] if body else []


def _of_kind(results: Sequence[Result], kind: str) -> list[Result]:
    return [r for r in results if r.kind == kind]


def claims_section(results: Sequence[Result]) -> list[str]:
    return _section(
        "Claims: ours vs the rivals, same run",
        claims.summary_table(claims.all_claims(results)),
        "Each claim is a ratio of medians of ours and a rival measured in the same run of "
        "the same history file (the newest run that measured both), never across runs; "
        "below 1 ours takes less time. A row gathers the claims of one comparison and one "
        "kind of time: eager end-to-end includes the host (what a caller sees; below "
        "about 1 ms it is host-bound), device time is CUDA-graph replay or do_bench of the "
        "kernels alone. Per-shape tables: docs/attention.md, docs/training_recipes.md, "
        "docs/distributed_notes.md.\n")


_FIGURES = (
    ("Attention: achieved TFLOP/s against sequence length (device time)",
     plots.attention_device, "attention_device"),
    ("Attention: eager forward + backward at batch 1 (what a caller sees)",
     plots.attention_eager, "attention_eager"),
    ("Train step per recipe, beside its floor", plots.train_step_recipes, "train_step"),
    ("Model step time by size and precision", plots.model_step_times, "model_steps"),
    ("DDP variants and bucket sweep", plots.ddp_variants, "ddp"),
    ("All-reduce bandwidth vs size", plots.allreduce_bandwidth, "allreduce"),
)


def figures_section(device: str, every: Sequence[Result], latest: Sequence[Result],
                    img_dir: Path, page_dir: Path) -> list[str]:
    """The plots; the attention and recipe figures pick one run among all of them, the
    others draw the newest result of each case."""
    lines = []
    for title, plot, name in _FIGURES:
        print(f"  plotting {name} ...", file=sys.stderr)
        source = every if plot in (plots.attention_device, plots.attention_eager,
                                   plots.train_step_recipes) else latest
        path = plot(source, img_dir / f"{slugify(device)}_{name}.png")
        if path is not None:
            lines += [f"### {title}\n", f"![{title}]({path.relative_to(page_dir).as_posix()})\n"]
    return lines


def topic_tables(results: Sequence[Result]) -> list[str]:
    """One compact table per topic, from the newest results."""
    lines = _section("Training recipes: eager vs PyTorch-only baseline vs ours",
                     tables.recipes_table(results),
                     "Train steps (forward, loss, backward, AdamW; batch 4, bf16) of the recipes "
                     "in `systems.model.recipes`, side by side when measured in one run; "
                     "times and speedups are medians; cold s: the first step alone, "
                     "compilation and autotuning included. "
                     + tables.provenance(_of_kind(results, "recipe"), "recipe"))
    lines += _section("Data-parallel training", tables.ddp_table(results),
                      tables.provenance(_of_kind(results, "ddp")))
    return lines


def device_section(device: str, runs: Sequence[Run], img_dir: Path, page_dir: Path) -> list[str]:
    every = [r for run in runs for r in run.results]
    latest = latest_results(runs)
    print(f"{device}: {len(runs)} runs, {len(latest)} benchmarks", file=sys.stderr)
    lines = [f"## {device}\n",
             f"{len(runs)} saved runs of {len(latest)} benchmarks. The newest result of each: "
             f"`systems report latest --gpu \"{device}\"`; two runs side by side: "
             "`systems report compare OLD NEW`.\n"]
    lines += claims_section(every)
    lines += figures_section(device, every, latest, img_dir, page_dir)
    lines += topic_tables(latest)
    return lines


def results_page(runs: Sequence[Run], out_dir: Path, img_dir: Path) -> str:
    """The whole page; plots are written under `img_dir` and linked relative to `out_dir`."""
    lines = ["# Results\n",
             f"Generated by `{_COMMAND}` (`make report`) from the saved runs under "
             "`.benchmarks/`; do not edit by hand. Histories are per GPU model: numbers from "
             "different GPUs are never mixed, and a ratio is only formed within one run.\n"]
    by_device = runs_by_device(runs)
    if not by_device:
        lines.append("No saved benchmark runs yet: run `make bench` on a GPU, commit "
                     "`.benchmarks/`, then regenerate this page.\n")
    for device, device_runs in sorted(by_device.items()):
        lines += device_section(device, device_runs, img_dir, out_dir)
    return "\n".join(lines).rstrip() + "\n"


def write_results_page(root: Path, out: Path, img: Path | None = None,
                       include_cpu: bool = False) -> str:
    """Write the page (and its plots, under `img`, default <out's folder>/img) from every run
    under `root`; ValueError where no usable run is there, before anything is written."""
    runs = [r for r in load_runs(root) if include_cpu or not r.device.lower().startswith("cpu")]
    if not any(run.results for run in runs):
        raise ValueError(f"no usable saved runs under {root}"
                         f"{'' if include_cpu else ' (CPU runs need --include-cpu)'}: "
                         "nothing to report, no page written")
    img = img or out.parent / "img"
    for folder in (out.parent, img):  # before the plots are drawn, not after
        check_writable_folder(folder)
    out.write_text(results_page(runs, out.parent, img))
    return f"wrote {out} ({len(runs)} runs)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docgen.results_page",
                                     description="write the results page and its plots",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(".benchmarks"),
                        help="histories, searched at any depth")
    parser.add_argument("--out", type=Path, default=Path("docs/RESULTS.md"), help="the page")
    parser.add_argument("--img", type=Path, default=None, help="default: <out's folder>/img")
    parser.add_argument("--include-cpu", action="store_true",
                        help="also report CPU runs (smoke numbers, skipped by default)")
    args = parser.parse_args(argv)
    try:
        print(write_results_page(args.root, args.out, args.img, args.include_cpu),
              file=sys.stderr)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
