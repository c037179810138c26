"""Hand-typed performance numbers in prose docs: a measured-looking number outside generated
blocks and fenced code, unless `ALLOWED` says why it is no measurement."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.docgen.doc_blocks import prose_lines

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


def scan(text: str, doc: str = "<doc>") -> list[Finding]:
    """Lines outside generated blocks and fenced code that look like a performance claim."""
    return [Finding(doc, number, line) for number, line in prose_lines(text, doc)
            if looks_like_a_claim(line)]
