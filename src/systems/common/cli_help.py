"""The help formatter and the parser every `python -m systems...` command line uses, and the
argument types of counts and sizes (checked as they parse, before any work)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and shows each option's default, unless it has
    none (None, an empty list, an off switch) or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default in (None, []) or action.default is argparse.SUPPRESS
                or "default" in text or not action.option_strings
                or isinstance(action, argparse._StoreTrueAction | argparse._HelpAction)):
            return text
        return f"{text} (default: %(default)s)".lstrip()


class ArgumentParser(argparse.ArgumentParser):
    """A parser whose refusals are one line (`prog: error: ...`) and exit status 2; --help
    still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _at_least(low: float, kind: type) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"takes {what}, got {text!r}") from None
        if not value >= low:  # NaN fails too
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # how argparse names the type in its messages
    return parse


positive_int = _at_least(1, int)
non_negative_int = _at_least(0, int)


def positive_float(text: str) -> float:
    value = _at_least(0, float)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be above 0, got 0")
    return value
