"""Generated blocks in prose docs, so that no number is typed by hand: the body between
`<!-- generated: NAME ARG... -->` and `<!-- end generated -->` is NAME's output for ARGs."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

Generator = Callable[..., str]

_OPEN = re.compile(r"^<!-- generated: (?P<spec>.+?) -->$")
_CLOSE = "<!-- end generated -->"


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
    parts: list[str | Block] = []
    plain: list[str] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    fenced = False  # markers inside fenced code are examples, not blocks
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if not opened and stripped.startswith("```"):
            fenced = not fenced
        start = None if fenced else _OPEN.match(stripped)
        if start and opened:
            raise BlockError(doc, number,
                             f"generated block opened inside the one at line {opened[0]}")
        if start:
            plain.append(line)
            parts.append("".join(plain))
            plain, opened, body = [], (number, start["spec"]), []
        elif stripped == _CLOSE and not fenced:
            if not opened:
                raise BlockError(doc, number, "end of a generated block that was never opened")
            name, *args = shlex.split(opened[1])
            parts.append(Block(name, tuple(args), opened[0], "".join(body)))
            plain, opened = [line], None
        elif opened:
            body.append(line)
        else:
            plain.append(line)
    if opened:
        raise BlockError(doc, opened[0], f"generated block is never closed ({_CLOSE!r})")
    parts.append("".join(plain))
    return parts


def render(text: str, generators: Mapping[str, Generator], doc: str = "<doc>") -> str:
    """`text` with every generated block's body replaced by its generator's output."""
    out = []
    for part in split_blocks(text, doc):
        if isinstance(part, str):
            out.append(part)
            continue
        if part.name not in generators:
            raise BlockError(doc, part.line, f"no generator named {part.name!r} (known: "
                        f"{', '.join(sorted(generators))})")
        try:
            body = generators[part.name](*part.args)
        except (ValueError, FileNotFoundError, TypeError) as error:
            raise BlockError(doc, part.line, f"{part.name}: {error}") from error
        out.append(body.rstrip("\n") + "\n")
    return "".join(out)


def prose_lines(text: str, doc: str = "<doc>") -> Iterable[tuple[int, str]]:
    """(line number, line) of every line outside generated blocks, markers and fenced code."""
    number, fenced = 0, False
    for part in split_blocks(text, doc):
        if isinstance(part, Block):
            number += part.body.count("\n")  # the closing marker opens the next part
            continue
        for line in part.splitlines():
            number += 1
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and not _OPEN.match(line.strip()) and line.strip() != _CLOSE:
                yield number, line
