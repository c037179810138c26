"""Rewrite the generated blocks of the prose docs from the sources they name."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.docgen.doc_blocks import render
from tools.docgen.doc_sources import generators
from tools.docgen.results_page import write_results_page

REPO = Path(__file__).resolve().parents[2]


def default_docs(repo: Path) -> list[Path]:
    """README.md, docs/ (but the results page, generated whole) and the studies' docs."""
    patterns = ("docs/*.md", "docs/*/README.md", "studies/README.md", "studies/*/README.md",
                "studies/*/runs/*.md")
    return [repo / "README.md", *(path for pattern in patterns for path in sorted(repo.glob(
        pattern)) if path != repo / "docs" / "RESULTS.md")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docgen", description=__doc__)
    parser.add_argument("docs", type=Path, nargs="*", help="default: every prose doc")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="where the blocks' sources are named from")
    parser.add_argument("--results", action="store_true",
                        help="first write <repo>/docs/RESULTS.md and its plots from the "
                        "histories under <repo>/.benchmarks/ (GPU runs only)")
    args = parser.parse_args(argv)
    docs = args.docs or default_docs(args.repo)
    try:
        if args.results:
            print(write_results_page(args.repo / ".benchmarks", args.repo / "docs" / "RESULTS.md"),
                  file=sys.stderr)
        changed = []
        for path in docs:
            text = path.read_text()
            if (new := render(text, generators(args.repo), str(path))) != text:
                path.write_text(new)
                changed.append(path)
    except (ValueError, OSError) as error:  # BlockError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"generated blocks of {len(docs)} docs, {len(changed)} changed"
          f"{': ' if changed else ''}{', '.join(map(str, changed))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
