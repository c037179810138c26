"""Rewrite the generated blocks of README.md, docs/*.md, studies/*/README.md and the logs
kept in studies/*/runs/*.md from the sources they name.

    python -m tools.docgen                 # every prose doc (docs/RESULTS.md is written whole)
    python -m tools.docgen docs/attention.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.docgen.doc_blocks import rewrite_docs
from tools.docgen.doc_sources import generators

REPO = Path(__file__).resolve().parents[2]


def default_docs(repo: Path) -> list[Path]:
    """The prose docs: README.md, every .md under docs/ except the generated results page,
    the READMEs of docs/' folders, and each study's README and the earlier logs kept in its
    runs/ folder (a log quotes its runs in generated blocks)."""
    return [repo / "README.md",
            *sorted(p for p in (repo / "docs").glob("*.md") if p.name != "RESULTS.md"),
            *sorted((repo / "docs").glob("*/README.md")),
            *sorted((repo / "studies").glob("*/README.md")),
            *sorted((repo / "studies").glob("*/runs/*.md"))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docgen", description=__doc__)
    parser.add_argument("docs", type=Path, nargs="*", help="default: every prose doc")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="where the blocks' sources are named from")
    args = parser.parse_args(argv)
    docs = args.docs or default_docs(args.repo)
    try:
        changed = rewrite_docs(docs, generators(args.repo))
    except (ValueError, FileNotFoundError) as error:  # BlockError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"generated blocks of {len(docs)} docs, {len(changed)} changed"
          f"{': ' if changed else ''}{', '.join(map(str, changed))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
