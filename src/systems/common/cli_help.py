"""The help formatter every `python -m systems...` command line uses."""

from __future__ import annotations

import argparse


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
