"""`systems report {latest,compare}`: views of saved runs.

latest:  the newest result of each benchmark over one GPU's runs, with its run file
compare: two run files side by side, changes beyond the noise highlighted
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from systems.common.cli_help import HelpFormatter
from systems.common.formatting import markdown_table
from systems.report.compare import compare_runs
from systems.runs.history import find_run, latest_results, load_run, load_runs, runs_by_device


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="systems report", description=__doc__,
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    latest = commands.add_parser("latest", help="newest result per benchmark for one GPU",
                                 formatter_class=HelpFormatter)
    latest.add_argument("--root", type=Path, default=Path(".benchmarks"),
                        help="histories, searched at any depth")
    _add_gpu_filter(latest, "substring of the GPU name (case-insensitive)")
    compare = commands.add_parser(
        "compare", formatter_class=HelpFormatter,
        help="compare two saved runs", description="Two saved runs side by side. A run is a "
        "path, or a run id as pytest-benchmark takes it (0012 or 0012_quick_combined), looked "
        "up under --root (in the GPU folder matching --gpu when ids repeat across GPUs).")
    compare.add_argument("old", help="run file or id")
    compare.add_argument("new", help="run file or id")
    compare.add_argument("--root", type=Path, default=Path(".benchmarks"),
                         help="where run ids are looked up")
    _add_gpu_filter(compare, "substring of the GPU folder that run ids are looked up in")
    return parser.parse_args(argv)


def _add_gpu_filter(parser: argparse.ArgumentParser, help: str) -> None:
    # --gpu, not --device: elsewhere --device is a torch device to run on, here a name filter.
    parser.add_argument("--gpu", default="", help=help)
    parser.add_argument("--device", dest="gpu", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # its old spelling


def _run_latest(args: argparse.Namespace) -> str:
    groups = {d: runs for d, runs in runs_by_device(load_runs(args.root)).items()
              if args.gpu.lower() in d.lower()}
    if not groups:
        raise ValueError(f"no saved runs under {args.root} for a GPU matching {args.gpu!r}")
    sections = []
    for device, runs in sorted(groups.items()):
        rows = [[r.name, f"{r.mean * 1e3:.3f} ± {r.stddev * 1e3:.3f}", r.run]
                for r in sorted(latest_results(runs), key=lambda r: r.fullname)]
        sections += [f"## {device}\n", markdown_table(["benchmark", "mean ± std ms", "run"], rows),
                     ""]
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        if args.command == "latest":
            print(_run_latest(args))
        else:
            old, new = (load_run(find_run(ref, args.root, args.gpu))
                        for ref in (args.old, args.new))
            print(compare_runs(old, new))
    except (ValueError, OSError) as error:  # BlockError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
