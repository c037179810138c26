"""No performance number is typed by hand in a prose doc: a measured-looking number outside
generated blocks and fenced code fails, unless `ALLOWED` says why it is no measurement."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.docgen.__main__ import default_docs
from tools.docgen.doc_blocks import CLOSE_MARKER, OPEN_MARKER, split_blocks

REPO = Path(__file__).resolve().parents[3]
COMMITTED_DOCS = default_docs(REPO)

_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)?(?:[-–]\d+(?:\.\d+)?)?"
_MEASURE = re.compile(
    _NUMBER + r"\s?(?:ms|µs|us|ns|TFLOP/s|GB/s|GiB/s|tokens/s|x(?![\w])|%)(?![\w/])")
_COMPARISON = re.compile(r"\b(?:faster|slower|speed-?up|beats?|wins?|loses?)\b", re.I)
# A comparison word counts with a measured-looking number: a decimal or "N times".
_COMPARED_NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])|\b\d+ times\b")

# (pattern, why it is not a measured claim): matched spans are removed before the scan.
ALLOWED: tuple[tuple[str, str], ...] = (
    (r"\b\d+(?:\.\d+)? x (?:H100|H200)", "a machine's GPU count"),
    (r"\b\d+ x \d+(?: x \d+)*\b", "a tile, tensor or problem shape"),
    (r"\b(?:within|not within|no more than|than) \d+%", "the distributed targets (issue "
     "requirements: within 3% of no communication, within 10% of FSDP2)"),
    (r"\b\d+% target\b", "the FSDP target named in the issue"),
    (r"\b15% slowdown", "the slowdown the gate is designed to catch (its test setting)"),
    (r"test_end_to_end:0\.15|injected 15%|\binjected_end_to_end_15pct\b",
     "the injected slowdown's setting"),
    (r"\b90% of the GPU\b", "the memory budget a recipe checkpoints for (a config value)"),
    (r"\(?\b\d+(?:\.\d+)?x the forward's", "an analytic FLOP multiple, not a measurement"),
    (r"\b\d+x (?:fewer|more) (?:bytes|FLOPs)\b", "an analytic count, not a measurement"),
    (r"\b\d+x PyTorch's fp32 error", "the correctness tests' error bound (a test setting)"),
    (r"\b(?:of|under|below) 1 ms\b", "the drift tool's --min-ms default, where the gate's "
     "tables split host-bound calls from the rest (a setting)"),
    (r"\bunder 2 ms\b|\b2 ms rule\b", "the gate's WALL_MIN_S (a setting)"),
    (r"\bleast 55% of the measured\b", "the training-step goal named in the issue"),
    (r"\bfloor is \*\*5%\*\*|\bmax\(15%", "the gate's clock floors (settings)"),
    (r"\b\d+(?:\.\d+)? x (?:spread|drift)\b", "the gate's threshold multipliers (settings)"),
    (r"\benqueueing 90% of a round\b", "the gate's host-bound rule (a setting)"),
    (r"\b(?:lasting 8%|for 30%) of\b", "the injected slowdowns' example settings"),
)
_ALLOWED = [re.compile(pattern) for pattern, _ in ALLOWED]


@dataclass(frozen=True)
class Finding:
    doc: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text.strip()}"


def looks_like_a_claim(line: str) -> bool:
    """A measured-looking number, or a comparison word with a number on the same line."""
    for pattern in _ALLOWED:
        line = pattern.sub(" ", line)
    return bool(_MEASURE.search(line)
                or (_COMPARISON.search(line) and _COMPARED_NUMBER.search(line)))


def prose_lines(text: str, doc: str = "<doc>") -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside generated blocks, markers and fenced code."""
    bodies_blank = "".join(part if isinstance(part, str) else "\n" * part.body.count("\n")
                           for part in split_blocks(text, doc))
    fenced = False
    for number, line in enumerate(bodies_blank.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        elif not fenced and not OPEN_MARKER.match(stripped) and stripped != CLOSE_MARKER:
            yield number, line


def scan(text: str, doc: str = "<doc>") -> list[Finding]:
    """Lines outside generated blocks and fenced code that look like a performance claim."""
    return [Finding(doc, number, line) for number, line in prose_lines(text, doc)
            if looks_like_a_claim(line)]


def test_committed_docs_type_no_performance_number_by_hand() -> None:
    # docs/profiling's summaries are written whole by systems.profiling; its README is prose.
    findings = [finding for doc in [*COMMITTED_DOCS, REPO / "docs" / "profiling" / "README.md"]
                for finding in scan(doc.read_text(), str(doc))]
    assert not findings, "performance numbers outside generated blocks (generate them, or " \
        "allow a non-claim in ALLOWED in this file with its reason):\n" + \
        "\n".join(map(str, findings))


@pytest.mark.parametrize("claim", [
    "Ours takes 0.42 ms here.",
    "the Triton kernels are 1.4x faster",
    "a 12% regression",
    "ours is faster by 0.3 at this length",
    "240 us per call",
    "700 TFLOP/s in bf16",
    "up to 3.35 GB/s",
])
def test_the_scan_flags_a_hand_typed_performance_number(claim: str) -> None:
    (finding,) = scan(f"# Doc\n\nSome prose.\n{claim}\n", "doc.md")
    assert (finding.doc, finding.line) == ("doc.md", 4)


def test_the_scan_skips_generated_blocks_code_and_allowed_non_claims() -> None:
    text = ("<!-- generated: x -->\n| 0.42 ms | 1.4x |\n<!-- end generated -->\n"
            "```bash\npytest --perf-profile quick  # 5% of the time\n```\n"
            "On 2 x H200, within 3% of the no-communication step.\n"
            "Tiles of 64 x 64, d = 128; ours is faster at d = 64.\n"
            "The injected 15% slowdown must be caught.\n")
    assert scan(text) == []


def test_findings_count_lines_of_the_whole_doc() -> None:
    text = "a\n<!-- generated: x -->\nb\nc\n<!-- end generated -->\nd 5 ms\n"
    (finding,) = scan(text)
    assert finding.line == 6
