"""Generated blocks in prose docs, so that no number is typed by hand: the body between
`<!-- generated: NAME ARG... -->` and `<!-- end generated -->` is NAME's output for ARGs."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

Generator = Callable[..., str]

OPEN_MARKER = re.compile(r"^<!-- generated: (?P<spec>.+?) -->$")
CLOSE_MARKER = "<!-- end generated -->"


def read_source(repo: Path, name: str, kind: str) -> object:
    """A generator's JSON source; ValueError saying it is not a `kind` where unreadable."""
    try:
        return json.loads((repo / name).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{name}: not a {kind} ({error})") from error


class BlockError(ValueError):
    """A doc's generated blocks cannot be rewritten; the message names the file and line."""

    def __init__(self, doc: str, line: int, why: str) -> None:
        super().__init__(f"{doc}:{line}: {why}")


@dataclass(frozen=True)
class Block:
    name: str
    args: tuple[str, ...]
    line: int  # 1-based line of the opening marker
    body: str


def split_blocks(text: str, doc: str = "<doc>") -> list[str | Block]:
    """The doc as plain text (markers and fenced code included) between generated blocks."""
    parts: list[str | Block] = [""]
    opened: tuple[int, str, list[str]] | None = None  # line, spec and body of the open block
    fenced = False  # markers inside fenced code are examples, not blocks
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if not opened and stripped.startswith("```"):
            fenced = not fenced
        if not fenced and (start := OPEN_MARKER.match(stripped)):
            if opened:
                raise BlockError(doc, number,
                                 f"generated block opened inside the one at line {opened[0]}")
            parts[-1] += line
            opened = (number, start["spec"], [])
        elif stripped == CLOSE_MARKER and not fenced:
            if not opened:
                raise BlockError(doc, number, "end of a generated block that was never opened")
            name, *args = shlex.split(opened[1])
            parts += [Block(name, tuple(args), opened[0], "".join(opened[2])), line]
            opened = None
        elif opened:
            opened[2].append(line)
        else:
            parts[-1] += line
    if opened:
        raise BlockError(doc, opened[0], f"generated block is never closed ({CLOSE_MARKER!r})")
    return parts


def render(text: str, generators: Mapping[str, Generator], doc: str = "<doc>") -> str:
    """`text` with every generated block's body replaced by its generator's output."""
    out = []
    for part in split_blocks(text, doc):
        if isinstance(part, str):
            out.append(part)
        elif part.name not in generators:
            raise BlockError(doc, part.line, f"no generator named {part.name!r} (known: "
                             f"{', '.join(sorted(generators))})")
        else:
            try:
                body = generators[part.name](*part.args)
            except (ValueError, FileNotFoundError, TypeError) as error:
                raise BlockError(doc, part.line, f"{part.name}: {error}") from error
            out.append(body.rstrip("\n") + "\n")
    return "".join(out)
