"""The generators behind the docs' generated blocks (`tools.docgen.doc_blocks`), by the
name a block uses, and the two small ones that need no module of their own. Each takes its
sources as paths relative to the repository root and returns markdown that ends with what
its numbers measure and which files (and commit) they come from."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from systems.attention import dispatch
from systems.common.formatting import markdown_table
from tools.docgen import claims, doc_accounting, doc_dp_scaling, doc_gate, doc_ratios, drift
from tools.docgen.doc_blocks import Generator, read_source

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_FORWARDS = {dispatch.TRITON: "Triton", dispatch.GLUON: "Gluon"}
_BACKWARDS = {dispatch.TWO_PASS: "two passes", dispatch.GLUON_ORDERED: "Gluon, dQ in a fixed order",
              dispatch.GLUON_UNORDERED: "Gluon, dQ in arrival order"}


def dispatch_table() -> str:
    """Every rule of `systems.attention.dispatch.TABLE`, in the order the dispatch tries them."""
    rows = [[f"sm_{''.join(map(str, rule.capability))}", _DTYPES.get(rule.dtype, str(rule.dtype)),
             rule.head_dim, rule.min_seq, rule.min_tokens, _FORWARDS[rule.kernels.forward],
             _BACKWARDS[rule.kernels.backward]] for rule in dispatch.TABLE]
    forward, backward = dispatch.DEFAULT.name.split("+")
    return (markdown_table(["GPU", "dtype", "d", "seq from", "tokens from", "forward",
                            "backward"], rows)
            + f"\n\nEverything else runs {_FORWARDS[forward]} + {_BACKWARDS[backward]}. "
            "(Rows of `systems.attention.dispatch.TABLE`.)\n")


def breakdown_side_by_side(repo: Path, *files: str) -> str:
    """Kernel time per step by category (`systems profile breakdown`'s JSON), a column per
    breakdown file, and the floors of the first file's workload."""
    if not files:
        raise ValueError("name at least one breakdown file")
    records = [read_source(repo, name, "breakdown record") for name in files]
    by_file = [{row["category"]: row for row in record["rows"]} for record in records]

    def cell(rows: dict, category: str, key: str) -> str:
        value = rows.get(category, {}).get(key)
        return "-" if value is None else f"{value:.1f}"

    rows = [[c, *(cell(rows, c, "ms") for rows in by_file), cell(by_file[0], c, "floor_ms")]
            for c in (row["category"] for row in records[0]["rows"])]
    rows.append(["step (unprofiled)", *(f"{r['unprofiled_wall_ms']:.1f}" for r in records), "-"])
    headers = ["category", *(f"{record['recipe']} ms ({Path(name).stem})"
                             for record, name in zip(records, files, strict=True)), "floor ms"]
    machines = sorted({f"{r.get('machine')}, {r.get('measured')}, {r.get('steps')} steps"
                       for r in records})
    commits = [record.get("commit") for record in records]
    recorded = ("commits " + ", ".join(c or "not recorded" for c in commits) if any(commits)
                else "the files record no commit")
    return (markdown_table(headers, rows) + "\n\nTime: GPU kernel time per step by category "
            f"(torch.profiler). From {', '.join(f'`{name}`' for name in files)} "
            f"({'; '.join(machines)}; {recorded}).\n")


def generators(repo: Path) -> dict[str, Generator]:
    """Every generator by the name a doc's block uses, reading sources under `repo`."""
    return {
        "attention-dispatch-table": dispatch_table,
        "gate-constants": doc_gate.gate_constants,
        "gate-tallies": partial(doc_gate.gate_tallies, repo),
        "gate-cases": partial(doc_gate.gate_cases, repo),
        "gate-noise": partial(doc_gate.gate_noise, repo),
        "drift": partial(drift.drift_block, repo),
        "breakdowns": partial(breakdown_side_by_side, repo),
        "headline": partial(claims.headline, repo),
        "accounting-memory": doc_accounting.config_memory_table,
        "accounting-checkpointing": doc_accounting.checkpointing_table,
        "accounting-xxl": doc_accounting.xxl_table,
        "accounting-communication": doc_accounting.communication_table,
        "dp-scaling": partial(doc_dp_scaling.dp_scaling, repo),
        "ratios": partial(doc_ratios.ratios, repo),
        "history": partial(doc_ratios.history, repo),
    }
