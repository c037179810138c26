"""Flags that several `systems` subcommands take: one spelling and one meaning each.

Every subcommand adds these through the functions here, so `--seq-len` is `--seq-len`
wherever a sequence length is asked for. Spellings retired when the commands were unified
still parse for now: each use prints one line naming the new flag. Counts and sizes are
checked as they parse, and a refusal is one line and exit status 2, before any work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from systems.common.cli_help import non_negative_int, positive_float, positive_int
from systems.model import MODEL_CONFIGS


class _RetiredFlag(argparse.Action):
    """An old spelling of a flag: stores into the new flag's destination and says so."""

    def __init__(self, option_strings: list[str], dest: str, replacement: str,
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS, **kwargs)
        self.replacement = replacement

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated, use {self.replacement}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add(parser: argparse.ArgumentParser, flag: str, retired: Sequence[str],
         **kwargs: object) -> argparse.Action:
    action = parser.add_argument(flag, **kwargs)
    for old in retired:
        parser.add_argument(old, dest=action.dest, action=_RetiredFlag, replacement=flag,
                            nargs=action.nargs, type=action.type, choices=action.choices,
                            metavar=action.metavar)
    return action


def add_size(parser: argparse.ArgumentParser, *, default: str | list[str],
             retired: Sequence[str] = ()) -> None:
    """`--size`: a model preset, or several where `default` is a list."""
    many = isinstance(default, list)
    _add(parser, "--size", retired, default=default, choices=list(MODEL_CONFIGS),
         nargs="+" if many else None, help="model presets" if many else "model preset")


def add_batch_size(parser: argparse.ArgumentParser, *, default: int,
                   help: str = "sequences per step", retired: Sequence[str] = ()) -> None:
    _add(parser, "--batch-size", retired, type=positive_int, default=default, help=help)


def add_seq_len(parser: argparse.ArgumentParser, *, default: int | list[int],
                retired: Sequence[str] = ("--context-length",)) -> None:
    """`--seq-len`: tokens per sequence of the run (the model's `max_seq_len` is the most
    it may be), or several where `default` is a list."""
    _add(parser, "--seq-len", retired, type=positive_int, default=default,
         nargs="+" if isinstance(default, list) else None, help="tokens per sequence")


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu, cuda or cuda:N")


def add_bucket_size_mb(parser: argparse.ArgumentParser, *, default: float,
                       retired: Sequence[str] = ()) -> None:
    _add(parser, "--bucket-size-mb", retired, type=positive_float, default=default,
         help="bucketed DDP's bucket, MiB")


def add_warmup_steps(parser: argparse.ArgumentParser, *, warmup: int, steps: int,
                     warmup_help: str = "untimed steps first",
                     steps_help: str = "timed steps") -> None:
    parser.add_argument("--warmup", type=non_negative_int, default=warmup, help=warmup_help)
    parser.add_argument("--steps", type=positive_int, default=steps, help=steps_help)
