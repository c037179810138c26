"""The generators behind the docs' generated blocks (`tools.docgen.doc_blocks`), by the
name a block uses. Each takes its sources as paths relative to the repository root and
returns markdown that ends with what its numbers measure and which files (and commit) they
come from."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tools.docgen import (
    doc_accounting,
    doc_breakdowns,
    doc_claims,
    doc_dispatch,
    doc_dp_scaling,
    doc_gate,
    doc_ratios,
)
from tools.docgen.doc_blocks import Generator


def generators(repo: Path) -> dict[str, Generator]:
    """Every generator by the name a doc's block uses, reading sources under `repo`."""
    return {
        "attention-dispatch-table": doc_dispatch.dispatch_table,
        "gate-constants": doc_gate.gate_constants,
        "gate-tallies": partial(doc_gate.gate_tallies, repo),
        "gate-cases": partial(doc_gate.gate_cases, repo),
        "gate-noise": partial(doc_gate.gate_noise, repo),
        "drift": partial(doc_gate.drift_summary, repo),
        "breakdowns": partial(doc_breakdowns.breakdown_side_by_side, repo),
        "headline": partial(doc_claims.headline, repo),
        "accounting-memory": doc_accounting.config_memory_table,
        "accounting-checkpointing": doc_accounting.checkpointing_table,
        "accounting-xxl": doc_accounting.xxl_table,
        "accounting-communication": doc_accounting.communication_table,
        "dp-scaling": partial(doc_dp_scaling.dp_scaling, repo),
        "ratios": partial(doc_ratios.ratios, repo),
        "history": partial(doc_ratios.history, repo),
    }
