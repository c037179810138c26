"""`systems {bench,profile,report,dist,tune,check-builds} ...`: every tool of the suite.

Each subcommand is its module's own command line (`systems bench --help` shows its flags);
the same thing has the same flag everywhere (`systems.cli_flags`). `dist` runs on every rank
of a torchrun launch: `torchrun --nproc-per-node N -m systems dist train ...`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from systems.common.cli_help import HelpFormatter


class Subcommand(NamedTuple):
    module: str  # has main(argv: list[str] | None) -> int | None
    summary: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "bench": Subcommand("systems.bench.cli",
                        "time forward, forward+backward or a train step of a model"),
    "profile": Subcommand("systems.profiling.cli",
                          "kernel summaries, memory timelines, a train step's breakdown"),
    "report": Subcommand("systems.report.cli",
                         "results page and views of saved benchmark runs"),
    "dist": Subcommand("systems.bench.distributed.cli",
                       "all-reduce and data-parallel train steps (run under torchrun)"),
    "tune": Subcommand("systems.attention.flash_triton.tune",
                       "time the Triton attention kernel's candidate configurations"),
    "check-builds": Subcommand("systems.bench.check_builds",
                               "build the kernels for each GPU target, check their limits"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="systems", description=__doc__,
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, subcommand in SUBCOMMANDS.items():
        commands.add_parser(name, help=subcommand.summary, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Hands everything after the subcommand's name to that subcommand's `main`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        build_parser().parse_args(argv[:1])  # --help, or a usage error naming the choices
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]].module)
    return module.main(argv[1:]) or 0
