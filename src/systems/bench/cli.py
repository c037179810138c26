"""`systems bench`: time forward / forward+backward / train step of a model.

`--recipe NAME` runs a training recipe of `systems.model.recipes` instead of the flags'
plain setup, with `--option KEY=VALUE` changing any of its settings, e.g.
`--recipe optimized --option compile_mode=reduce-overhead --option fused_loss=false`.
A recipe's train step recomputes blocks where it would not fit on the GPU, by the perf
cases' rule (`systems.bench.checkpoint_fit`), unless an option sets checkpointing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

import torch

from systems.attention import ATTENTION_BACKENDS, unsupported_reason
from systems.bench.checkpoint_fit import fit_to_device
from systems.bench.metrics import (
    is_out_of_memory,
    peak_memory_bytes,
    reset_peak_memory,
    throughput_metrics,
)
from systems.bench.timing import time_steps
from systems.bench.workloads import build_model_workload, build_recipe_workload
from systems.cli_flags import (
    add_batch_size,
    add_device,
    add_seq_len,
    add_size,
    add_warmup_steps,
)
from systems.common.cli_help import ArgumentParser, HelpFormatter
from systems.common.formatting import fmt
from systems.common.hardware import machine_description
from systems.model import get_config
from systems.model.recipes import RECIPES, Recipe, get_recipe
from systems.model.train_step import CUDA_GRAPH_WARMUP, MODES, PRECISIONS
from systems.runs.validate import check_writable_folder


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="systems bench",
        description="Time a Transformer LM step with explicit warm-up and device sync.",
        formatter_class=HelpFormatter,
    )
    add_size(parser, default="small")
    for name in ("d-model", "d-ff", "num-layers", "num-heads", "vocab-size"):
        parser.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")
    add_seq_len(parser, default=512)
    add_batch_size(parser, default=4)
    parser.add_argument("--mode", action="append", choices=MODES,
                        help="repeatable; default: all three")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), help="default fp32")
    parser.add_argument("--attention", choices=sorted(ATTENTION_BACKENDS),
                        help="default reference")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--recipe", choices=sorted(RECIPES),
                        help="a training recipe's setup (precision, attention, compile, ...)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="with --recipe, repeatable: change one of its settings")
    add_warmup_steps(parser, warmup=CUDA_GRAPH_WARMUP + 1, steps=10,
                     warmup_help="untimed steps first (%(default)s: up to and including the "
                                 "one a cuda_graph step is captured in)")
    add_device(parser)
    parser.add_argument("--json", type=Path,
                        help="write results to this file (checked before anything runs)")
    return parser


def _config_from_args(args: argparse.Namespace):
    overrides = {
        field: getattr(args, field)
        for field in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
        if getattr(args, field) is not None
    }
    config = get_config(args.size)
    if overrides:  # a model of its own: long enough for the run's sequences
        overrides["max_seq_len"] = max(config.max_seq_len, args.seq_len)
    return config.with_overrides(**overrides) if overrides else config


_BOOLEANS = {"true": True, "false": False, "1": True, "0": False}


def recipe_settings(recipe: Recipe) -> dict[str, object]:
    """Every setting `--option` can change, with the recipe's value."""
    top = {f.name: getattr(recipe, f.name) for f in fields(recipe) if f.name != "options"}
    return {**top, **asdict(recipe.options)}


def _option_value(key: str, text: str, current: object) -> object:
    """`text` as the type of the setting's current value: booleans take true/false (or 1/0),
    integers an integer, floats a number; 'none' clears a setting that may be unset; else
    the string."""
    lowered = text.lower()
    if isinstance(current, bool):
        if lowered not in _BOOLEANS:
            raise ValueError(f"--option {key} takes true or false, got {text!r}")
        return _BOOLEANS[lowered]
    for kind, what in ((int, "an integer"), (float, "a number")):
        if isinstance(current, kind):
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"--option {key} takes {what}, got {text!r}") from None
    return None if lowered == "none" and current is None else text


def recipe_overrides(recipe: str, options: list[str]) -> dict[str, object]:
    """`--option KEY=VALUE` items as settings of the named recipe, typed like its values;
    an unknown key or a value of the wrong type is a ValueError that says what is valid."""
    settings = recipe_settings(RECIPES[recipe])
    overrides = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option takes KEY=VALUE, got {item!r}")
        if key not in settings:
            raise ValueError(f"--option: unknown setting {key!r}; the recipe's settings are "
                             f"{', '.join(sorted(settings))}")
        overrides[key] = _option_value(key, value, settings[key])
    return overrides


def _recipe_overrides(args: argparse.Namespace) -> dict[str, object]:
    if args.recipe is None:
        if args.option:
            raise ValueError("--option needs --recipe")
        return {}
    if args.precision or args.attention or args.compile:
        raise ValueError("with --recipe, change its precision, attention or compilation "
                         "with --option precision=..., attention=..., compiled=...")
    return recipe_overrides(args.recipe, args.option)


def check_device(name: str) -> torch.device:
    """The `--device` as a torch.device; a CUDA device must exist here."""
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r}: {error}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {name}: no CUDA device here (torch {torch.__version__}, "
                             f"built for CUDA {torch.version.cuda}); use --device cpu")
        if (device.index or 0) >= count:
            raise ValueError(f"--device {name}: only {count} CUDA device(s) here")
    return device


def check_attention(args: argparse.Namespace, overrides: dict[str, object],
                    device: torch.device) -> None:
    """The run's attention backend can run on this device, dtype and sequence length (else
    its times would be reported under the name of a backend that did not run)."""
    if args.recipe is None:
        attention, precision = args.attention or "reference", args.precision or "fp32"
    else:
        recipe = get_recipe(args.recipe, **overrides)
        attention, precision = recipe.attention, recipe.precision
    dtype = PRECISIONS[precision] or torch.float32
    reason = unsupported_reason(attention, device, dtype, args.seq_len)
    if reason is not None:
        raise ValueError(f"attention {attention!r} cannot run on {device} at {precision}: "
                         f"{reason}")


def check_json_destination(path: Path) -> None:
    """Fail now, not after the whole run, if `path` cannot be written (`check_writable_folder`
    of its folder, as the perf suite checks its own destinations)."""
    if path.is_dir():
        raise ValueError(f"--json {path}: is a folder, not a file")
    try:
        check_writable_folder(path.parent)
    except OSError as error:
        raise ValueError(f"--json {path}: cannot write there ({error})") from None


def run_benchmark(args: argparse.Namespace) -> list[dict[str, object]]:
    """Every check on the input comes before the first workload is built."""
    if args.json:
        check_json_destination(args.json)
    device = check_device(args.device)
    config = _config_from_args(args)
    overrides = _recipe_overrides(args)
    check_attention(args, overrides, device)
    return [_run_mode(config, args, mode, overrides) for mode in args.mode or MODES]


def _build(config, args: argparse.Namespace, mode: str, overrides: dict[str, object]):
    if args.recipe is None:
        return build_model_workload(
            config, batch_size=args.batch_size, seq_len=args.seq_len, mode=mode,
            precision=args.precision or "fp32", compiled=args.compile,
            attention=args.attention or "reference", device=args.device)
    recipe = get_recipe(args.recipe, **overrides)
    if mode == "train_step":  # recompute blocks as the perf cases do, where it would not fit
        recipe = fit_to_device(recipe, config, args.batch_size, args.seq_len,
                               args.device).recipe
    return build_recipe_workload(config, recipe, batch_size=args.batch_size,
                                 seq_len=args.seq_len, device=args.device, mode=mode)


def _run_mode(config, args: argparse.Namespace, mode: str,
              overrides: dict[str, object]) -> dict[str, object]:
    workload = _build(config, args, mode, overrides)
    record: dict[str, object] = {"size": args.size, "recipe": args.recipe,
                                 **workload.describe()}
    print(f"[{mode}] warm-up {args.warmup}, timing {args.steps} steps ...", file=sys.stderr)
    reset_peak_memory(workload.device)
    try:
        stats = time_steps(workload.step, warmup=args.warmup, steps=args.steps,
                           device=workload.device)
    except Exception as error:  # an OOM is a result for this workload, not a crash
        if not is_out_of_memory(error):
            raise
        return {**record, "outcome": f"out of memory: {str(error).splitlines()[0]}"}
    return {
        **record, "outcome": "ok", "timing": stats.to_dict(),
        "peak_memory_bytes": peak_memory_bytes(workload.device),
        **throughput_metrics(seconds=stats.mean, flops=workload.flops, tokens=workload.tokens,
                             precision=workload.precision, device=workload.device),
    }


def format_table(results: list[dict[str, object]]) -> str:
    header = f"{'mode':<18}{'mean ms':>10}{'std ms':>9}{'median ms':>11}{'min ms':>9}" \
             f"{'host ms':>9}{'TFLOP/s':>9}{'MFU':>7}{'tok/s':>10}{'peak GiB':>10}  outcome"
    lines = [header, "-" * len(header)]
    for r in results:
        if r["outcome"] != "ok":
            lines.append(f"{r['mode']:<18}{'-':>10}{'':>9}{'':>11}{'':>9}{'':>9}{'':>9}"
                         f"{'':>7}{'':>10}{'':>10}  {r['outcome']}")
            continue
        t = r["timing"]
        mem = r["peak_memory_bytes"]
        lines.append(
            f"{r['mode']:<18}{t['mean'] * 1e3:>10.2f}{t['std'] * 1e3:>9.2f}"
            f"{t['median'] * 1e3:>11.2f}{t['min'] * 1e3:>9.2f}"
            f"{fmt(t['host_median'], '.2f', 1e3):>9}{fmt(r['tflops'], '.1f'):>9}"
            f"{fmt(r['mfu'], '.1%'):>7}{fmt(r['tokens_per_s'], ',.0f'):>10}"
            f"{fmt(mem or None, '.2f', 2**-30):>10}  ok"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results = run_benchmark(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.json:
        payload = {"machine": machine_description(args.device), "results": results}
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
