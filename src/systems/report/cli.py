"""`systems report {results,latest,compare}`: pages and views of saved runs.

results: regenerate docs/RESULTS.md and docs/img/*.png from every run under .benchmarks/
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
from systems.report.page import results_page
from systems.report.tables import mean_std_ms
from systems.runs.history import find_run, latest_results, load_run, load_runs, runs_by_device
from systems.runs.validate import check_writable_folder


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="systems report", description=__doc__,
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    results = commands.add_parser("results", help="write the results page and its plots",
                                  formatter_class=HelpFormatter)
    results.add_argument("--root", type=Path, default=Path(".benchmarks"),
                         help="histories, searched at any depth")
    results.add_argument("--out", type=Path, default=Path("docs/RESULTS.md"), help="the page")
    results.add_argument("--img", type=Path, default=None, help="default: <out's folder>/img")
    results.add_argument("--include-cpu", action="store_true",
                         help="also report CPU runs (smoke numbers, skipped by default)")
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


def _run_results(args: argparse.Namespace) -> str:
    runs = [r for r in load_runs(args.root)
            if args.include_cpu or not r.device.lower().startswith("cpu")]
    if not any(run.results for run in runs):
        raise ValueError(f"no usable saved runs under {args.root}"
                         f"{'' if args.include_cpu else ' (CPU runs need --include-cpu)'}: "
                         "nothing to report, no page written")
    img = args.img or args.out.parent / "img"
    for folder in (args.out.parent, img):  # before the plots are drawn, not after
        check_writable_folder(folder)
    page = results_page(runs, args.out.parent, img)
    args.out.write_text(page)
    return f"wrote {args.out} ({len(runs)} runs)"


def _run_latest(args: argparse.Namespace) -> str:
    groups = {d: runs for d, runs in runs_by_device(load_runs(args.root)).items()
              if args.gpu.lower() in d.lower()}
    if not groups:
        raise ValueError(f"no saved runs under {args.root} for a GPU matching {args.gpu!r}")
    sections = []
    for device, runs in sorted(groups.items()):
        rows = [[r.name, mean_std_ms(r, 3), r.run]
                for r in sorted(latest_results(runs), key=lambda r: r.fullname)]
        sections += [f"## {device}\n", markdown_table(["benchmark", "mean ± std ms", "run"], rows),
                     ""]
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        if args.command == "results":
            print(_run_results(args), file=sys.stderr)
        elif args.command == "latest":
            print(_run_latest(args))
        else:
            old, new = (load_run(find_run(ref, args.root, args.gpu))
                        for ref in (args.old, args.new))
            print(compare_runs(old, new))
    except (ValueError, OSError) as error:  # BlockError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
