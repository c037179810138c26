"""Every relative link in the prose docs and the results page reaches a file that exists and,
where it names a heading (`file.md#anchor`), a heading of that file: a moved log entry or a
renamed section must not leave a reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.docgen.__main__ import REPO, default_docs

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
HEADING = re.compile(r"^#+\s+(.*?)\s*$", flags=re.M)


def heading_anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading: lower case, punctuation
    dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of `doc`'s headings, a repeated one numbered as renderers number it."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", doc.read_text())):
        anchor = heading_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def dead_links(doc: Path) -> list[str]:
    dead = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: and the like
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            dead.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            dead.append(f"{target}: no such heading")
    return dead


DOCS = [*default_docs(REPO), REPO / "docs" / "RESULTS.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_relative_link_reaches_its_file_and_heading(doc):
    assert dead_links(doc) == []


def test_a_dead_file_and_a_dead_heading_are_caught(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## FA3's order at d = 64 (2026-11-28)\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[a](other.md#fa3s-order-at-d--64-2026-11-28) [b](other.md#title)\n"
                   "[c](missing.md) [d](other.md#gone) [e](https://example.org/x#y)\n"
                   "```\n[f](inside-a-fence.md)\n```\n")
    assert dead_links(doc) == ["missing.md: no such file", "other.md#gone: no such heading"]


def test_a_repeated_heading_takes_a_number_and_a_fenced_one_is_no_heading(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("## Run it\n\n## Run it\n\n```\n# not a heading\n```\n")
    assert anchors(doc) == {"run-it", "run-it-1"}
