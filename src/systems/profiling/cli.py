"""`systems profile {compute,memory,breakdown}`: kernel summaries, memory
timelines and a train step's kernel time by category.

compute: torch.profiler over forward / forward+backward / train step after warm-up; writes
         profile_summary.md and a gzipped Chrome trace per workload (CPU: CPU ops only).
memory:  CUDA allocation history per workload; writes memory_summary.md, a timeline PNG per
         workload and, when under the size limit, the snapshot pickle and an HTML viewer.
breakdown: kernel time of one recipe's train step by category, each beside its floor.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

from systems.attention import ATTENTION_BACKENDS
from systems.bench.checkpoint_fit import fit_to_device
from systems.bench.cli import recipe_overrides
from systems.bench.workloads import build_model_workload, build_recipe_workload
from systems.cli_flags import (
    add_batch_size,
    add_device,
    add_seq_len,
    add_size,
    add_warmup_steps,
)
from systems.common.cli_help import ArgumentParser, HelpFormatter, positive_int
from systems.common.hardware import device_name
from systems.model import get_config
from systems.model.recipes import RECIPES, get_recipe, runnable_on
from systems.model.train_step import CUDA_GRAPH_WARMUP, MODES, PRECISIONS
from systems.profiling import step_breakdown
from systems.profiling.compute import profile_workload
from systems.profiling.memory import (
    MemoryCase,
    NeedsCudaError,
    activation_arithmetic_table,
    largest_allocations_section,
    peak_memory_table,
    record_memory,
)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="systems profile", description=__doc__,
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, modes in (("compute", list(MODES)), ("memory", ["forward", "train_step"])):
        sub = commands.add_parser(name, formatter_class=HelpFormatter)
        add_size(sub, default=["small"])
        add_seq_len(sub, default=[512])
        sub.add_argument("--mode", nargs="+", default=modes, choices=MODES, help="steps to run")
        sub.add_argument("--precision", nargs="+", default=["fp32"], choices=sorted(PRECISIONS),
                         help="precisions")
        add_batch_size(sub, default=4)
        sub.add_argument("--out", type=Path, required=True, help="output folder")
        sub.add_argument("--max-artifact-mb", type=float, default=15.0,
                         help="drop a trace / snapshot / HTML file larger than this")
    compute = commands.choices["compute"]
    add_warmup_steps(compute, warmup=2, steps=3, warmup_help="untraced steps first",
                     steps_help="traced steps")
    compute.add_argument("--attention", default="reference", choices=sorted(ATTENTION_BACKENDS),
                         help="attention backend")
    add_device(compute)
    memory = commands.choices["memory"]
    memory.add_argument("--steps", type=positive_int, default=2,
                        help="recorded steps after model build")
    memory.add_argument("--no-html", action="store_true", help="skip the HTML viewers")
    _add_breakdown_parser(commands)
    return parser


def _add_breakdown_parser(commands) -> None:
    breakdown = commands.add_parser(
        "breakdown", description=step_breakdown.__doc__,
        formatter_class=HelpFormatter,
        help="kernel time of a training recipe's step by category, beside its floor")
    breakdown.add_argument("--recipe", default="optimized", choices=sorted(RECIPES),
                           help="training recipe")
    breakdown.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                           help="repeatable: change one of the recipe's settings")
    add_size(breakdown, default="2.7b")
    add_seq_len(breakdown, default=512)
    add_batch_size(breakdown, default=4)
    add_warmup_steps(breakdown, warmup=CUDA_GRAPH_WARMUP + 1, steps=10,
                     warmup_help="steps before timing and profiling (enough to capture a "
                                 "CUDA graph)", steps_help="timed, then profiled steps")
    breakdown.add_argument("--matmul-tflops", type=float,
                           default=step_breakdown.DEFAULT_MATMUL_TFLOPS,
                           help="matmul ceiling for the FLOP floors")
    breakdown.add_argument("--copy-gbps", type=float,
                           help="copy bandwidth (read + written) for the byte floors; "
                                "default: measured by a 1 GiB same-device copy")
    add_device(breakdown)
    breakdown.add_argument("--commit", help="the commit whose code ran, recorded with the "
                                            "breakdown (a copy without .git cannot tell)")
    breakdown.add_argument("--out", type=Path, required=True, help="output folder")


def _header(title: str, device: str) -> str:
    return (f"# {title}\n\nDevice: {device_name(device)}; torch {torch.__version__}. "
            f"Generated by `systems profile`.\n")


def run_compute(args: argparse.Namespace) -> str:
    sections = [_header("Compute profile", args.device)]
    if torch.device(args.device).type != "cuda":
        sections.append("No CUDA device: the tables show CPU ops' self time, not GPU kernels.\n")
    for size, ctx, precision, mode in itertools.product(
            args.size, args.seq_len, args.precision, args.mode):
        tag = f"{size}_ctx{ctx}_{mode}_{precision}"
        print(f"profiling {tag} ...", file=sys.stderr)
        workload = build_model_workload(
            get_config(size), batch_size=args.batch_size, seq_len=ctx, mode=mode,
            precision=precision, attention=args.attention, device=args.device)
        result = profile_workload(workload, tag, warmup=args.warmup, steps=args.steps,
                                  out_dir=args.out, max_trace_mb=args.max_artifact_mb)
        trace = f"Chrome trace: `{result.trace.name}`\n" if result.trace else ""
        sections += [result.markdown, trace]
        del workload
    return _write(args.out / "profile_summary.md", sections)


def run_memory(args: argparse.Namespace) -> str:
    cases = [MemoryCase(size, get_config(size), ctx, precision, mode, args.batch_size)
             for size, ctx, precision, mode in itertools.product(
                 args.size, args.seq_len, args.precision, args.mode)]
    arithmetic = ["## Activation arithmetic (analytic, `systems.accounting`)\n",
                  activation_arithmetic_table(cases), ""]
    if not torch.cuda.is_available():
        print("\n".join(arithmetic))
        raise NeedsCudaError("memory timelines need a CUDA GPU: torch.cuda.memory records "
                             "allocation history only for the CUDA caching allocator. "
                             "The analytic activation sizes above need no GPU.")
    runs = []
    for i, case in enumerate(cases):
        print(f"memory {i + 1}/{len(cases)}: {case.tag} ...", file=sys.stderr)
        runs.append(record_memory(case, steps=args.steps, out_dir=args.out,
                                  max_artifact_mb=args.max_artifact_mb, html=not args.no_html))
    sections = [_header("Memory profile", "cuda"),
                f"Allocation history from model construction through {args.steps} steps "
                f"(batch {args.batch_size}). 'Predicted' is the analytic lower bound of "
                "`systems.accounting.step_memory`: the larger of (parameters + AdamW moments "
                "+ saved activations) when backward starts and (parameters + gradients + "
                "moments + AdamW's sqrt(v) buffer) during the optimizer step.\n",
                "## Peak memory\n", peak_memory_table(runs), "", *arithmetic]
    for run in runs:
        if run.outcome != "ok":
            continue
        files = ", ".join(f"`{p.name}`" for p in run.files)
        sections += [f"## {run.case.tag}\n", f"![timeline](memory_{run.case.tag}.png)\n",
                     f"Files: {files}\n", "Largest allocations:\n",
                     largest_allocations_section(run), ""]
    return _write(args.out / "memory_summary.md", sections)


def run_breakdown(args: argparse.Namespace) -> str:
    """breakdown.md and breakdown.json of one recipe's train step, recomputing blocks as
    the perf cases do where it would not fit. Off CUDA the recipe's CUDA graph is turned
    off (the builder would refuse it) and CPU ops are measured."""
    config = get_config(args.size)
    recipe = runnable_on(get_recipe(args.recipe, **recipe_overrides(args.recipe, args.option)),
                         args.device)
    recipe = fit_to_device(recipe, config, args.batch_size, args.seq_len, args.device).recipe
    workload = build_recipe_workload(config, recipe, batch_size=args.batch_size,
                                     seq_len=args.seq_len, device=args.device)
    record = step_breakdown.recipe_breakdown(
        workload, recipe=args.recipe, warmup=args.warmup, steps=args.steps,
        matmul_tflops=args.matmul_tflops, copy_gbps=args.copy_gbps)
    record["machine"] = device_name(args.device)
    record["commit"] = args.commit
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "breakdown.json").write_text(json.dumps(record, indent=2))
    return _write(args.out / "breakdown.md", [
        _header("Train-step kernel breakdown", args.device),
        step_breakdown.breakdown_markdown(record)])


def _write(path: Path, sections: list[str]) -> str:
    text = "\n".join(sections).rstrip() + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return text


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        text = {"compute": run_compute, "memory": run_memory,
                "breakdown": run_breakdown}[args.command](args)
    except (NeedsCudaError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(text)
    return 0
