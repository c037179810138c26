"""`systems {bench,profile,report,dist,tune}`: dispatch, one flag per concept, retired flags."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import systems
from systems import cli
from systems.common.cli_help import HelpFormatter, positive_float, positive_int

ROOT = Path(systems.__file__).parents[2]

# The flag each concept has in every subcommand that takes it, by argparse destination.
CANONICAL = {"size": "--size", "batch_size": "--batch-size", "seq_len": "--seq-len",
             "device": "--device", "bucket_size_mb": "--bucket-size-mb", "warmup": "--warmup",
             "steps": "--steps", "optimizer": "--optimizer", "json": "--json", "out": "--out"}
# Spellings of those concepts that no subcommand may show any more.
RETIRED = {"--context-length", "--context", "--ctx", "--seq", "--model", "--batch",
           "--bucket-mb"}
EXPECTED_PROG = {"bench": "systems bench", "profile": "systems profile",
                 "report": "systems report", "dist": "torchrun ... -m systems dist",
                 "tune": "python -m systems.attention.flash_triton.tune",
                 "check-builds": "systems check-builds"}


class _Reached(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(subcommand: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser `systems SUBCOMMAND` hands its arguments to, caught as it starts parsing."""
    def reached(self, args=None, namespace=None):
        raise _Reached(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", reached)
        with pytest.raises(_Reached) as caught:
            cli.main([subcommand])
    return caught.value.parser


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every subcommand parser below it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += all_parsers(sub)
    return found


def visible_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def _per_subcommand() -> list:
    return list(cli.SUBCOMMANDS)


@pytest.mark.parametrize("subcommand", _per_subcommand())
def test_each_subcommand_dispatches_to_its_parser(subcommand: str, monkeypatch,
                                                  capsys) -> None:
    assert parser_of(subcommand, monkeypatch).prog == EXPECTED_PROG[subcommand]
    with pytest.raises(SystemExit) as exit_:
        cli.main([subcommand, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {EXPECTED_PROG[subcommand]} ")


def test_top_level_help_lists_every_subcommand_with_one_line() -> None:
    src = str(ROOT / "src")
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join(filter(None, [
        src, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "systems", "--help"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    for name, subcommand in cli.SUBCOMMANDS.items():
        (at,) = [i for i, x in enumerate(lines) if x.split()[:1] == [name]]
        # argparse moves the summary of a long name (check-builds) to the next line
        words = lines[at].split(None, 1)
        assert (words[1] if len(words) > 1 else lines[at + 1].strip()) == subcommand.summary
    wrong = subprocess.run([sys.executable, "-m", "systems", "benchmark"],
                           capture_output=True, text=True, env=env)
    assert wrong.returncode == 2 and "invalid choice: 'benchmark'" in wrong.stderr


def test_console_script_is_the_same_command() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["systems"].partition(":")
    assert (module, function) == ("systems.cli", "main")


@pytest.mark.parametrize("subcommand", _per_subcommand())
def test_one_flag_per_concept(subcommand: str, monkeypatch) -> None:
    for parser in all_parsers(parser_of(subcommand, monkeypatch)):
        for action in visible_flags(parser):
            where = f"{parser.prog} {action.option_strings}"
            assert not RETIRED & set(action.option_strings), where
            if action.dest in CANONICAL:
                assert action.option_strings == [CANONICAL[action.dest]], where
            for flag in action.option_strings:
                assert CANONICAL.get(action.dest, flag) == flag, where


def test_shared_flags_mean_the_same_everywhere(monkeypatch) -> None:
    """Where two subcommands take the same concept, it parses to the same type."""
    types: dict[str, set] = {}
    for name in cli.SUBCOMMANDS:
        for parser in all_parsers(parser_of(name, monkeypatch)):
            for action in visible_flags(parser):
                if action.dest in ("size", "batch_size", "seq_len", "bucket_size_mb"):
                    types.setdefault(action.dest, set()).add(action.type)
    assert types == {"size": {None}, "batch_size": {positive_int}, "seq_len": {positive_int},
                     "bucket_size_mb": {positive_float}}


@pytest.mark.parametrize("subcommand", _per_subcommand())
def test_every_help_shows_defaults(subcommand: str, monkeypatch) -> None:
    for parser in all_parsers(parser_of(subcommand, monkeypatch)):
        assert parser.formatter_class is HelpFormatter, parser.prog


@pytest.mark.parametrize(
    ("subcommand", "argv", "expected", "retired"),
    [
        ("bench", ["--context-length", "64"], {"seq_len": 64},
         [("--context-length", "--seq-len")]),
        ("profile", ["compute", "--out", "x", "--context-length", "64", "128"],
         {"seq_len": [64, 128]}, [("--context-length", "--seq-len")]),
        ("profile", ["breakdown", "--out", "x", "--context-length", "64"], {"seq_len": 64},
         [("--context-length", "--seq-len")]),
        ("dist", ["train", "--model", "small", "--batch", "2", "--context", "64",
                  "--bucket-mb", "5"],
         {"size": "small", "batch_size": 2, "seq_len": 64, "bucket_size_mb": 5.0},
         [("--model", "--size"), ("--batch", "--batch-size"), ("--context", "--seq-len"),
          ("--bucket-mb", "--bucket-size-mb")]),
    ],
)
def test_retired_flags_still_parse_with_one_warning_each(subcommand, argv, expected, retired,
                                                         monkeypatch, capsys) -> None:
    parser = parser_of(subcommand, monkeypatch)
    args = vars(parser.parse_args(argv))
    assert {k: args[k] for k in expected} == expected
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == len(retired)
    for line, (old, new) in zip(warnings, retired, strict=True):
        assert line.endswith(f": {old} is deprecated, use {new}")
    for sub in all_parsers(parser):  # the retired spellings are hidden from help
        assert not RETIRED & set(sub.format_help().split()), sub.prog


def test_new_flags_parse_without_warnings(monkeypatch, capsys) -> None:
    args = parser_of("dist", monkeypatch).parse_args(
        ["train", "--size", "small", "--batch-size", "2", "--seq-len", "64",
         "--bucket-size-mb", "5", "--optimizer", "sharded"])
    assert (args.size, args.batch_size, args.seq_len, args.bucket_size_mb, args.optimizer) == (
        "small", 2, 64, 5.0, "sharded")
    assert capsys.readouterr().err == ""
