"""The generators behind the docs' generated blocks (`tools.docgen.doc_blocks`), by the
name a block uses. Each takes its sources as paths relative to the repository root and
returns markdown that ends with what its numbers measure and which files (and commit) they
come from."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tools.docgen import (
    doc_accounting,
    doc_attention,
    doc_backward,
    doc_claims,
    doc_dispatch,
    doc_dp_scaling,
    doc_gate,
    doc_profiles,
    doc_recipes,
)
from tools.docgen.doc_blocks import Generator


def generators(repo: Path) -> dict[str, Generator]:
    """Every generator by the name a doc's block uses, reading sources under `repo`."""
    return {
        "attention-eager": partial(doc_attention.attention_eager, repo),
        "attention-eager-interleaved": partial(doc_attention.attention_eager_interleaved, repo),
        "attention-device-time": partial(doc_attention.attention_device_time, repo),
        "attention-device-in-turn": partial(doc_attention.attention_device_in_turn, repo),
        "attention-fa4-history": partial(doc_attention.fa4_history, repo),
        "attention-backward-variants": partial(doc_attention.attention_backward_variants,
                                               repo),
        "attention-host-profile": partial(doc_profiles.host_profile, repo),
        "attention-host-timings": partial(doc_profiles.host_timings, repo),
        "attention-backward-passes": partial(doc_backward.backward_passes, repo),
        "attention-gluon-backward": partial(doc_backward.gluon_backward, repo),
        "attention-gluon-forward": partial(doc_backward.gluon_forward, repo),
        "attention-gluon-schedules": partial(doc_backward.ordered_schedules, repo),
        "attention-gluon-orders": partial(doc_backward.tile_end_orders, repo),
        "attention-gluon-chains": partial(doc_backward.longest_first_chains, repo),
        "attention-gluon-launch-orders": partial(doc_backward.launch_orders, repo),
        "attention-fa4-split": partial(doc_backward.forward_backward_split, repo),
        "attention-gluon-trees": partial(doc_backward.trees_in_turn, repo),
        "attention-kernel-breakdown": partial(doc_backward.kernel_breakdown, repo),
        "attention-tile-order": partial(doc_backward.tile_order, repo),
        "attention-one-matrix": partial(doc_backward.one_matrix, repo),
        "attention-dispatch-table": doc_dispatch.dispatch_table,
        "attention-dispatch-study": partial(doc_dispatch.dispatch_study, repo),
        "gate-constants": doc_gate.gate_constants,
        "gate-tallies": partial(doc_gate.gate_tallies, repo),
        "gate-cases": partial(doc_gate.gate_cases, repo),
        "gate-noise": partial(doc_gate.gate_noise, repo),
        "drift": partial(doc_gate.drift_summary, repo),
        "recipe-ratios": partial(doc_recipes.recipe_ratios, repo),
        "recipe-attention": partial(doc_recipes.recipe_attention, repo),
        "breakdowns": partial(doc_recipes.breakdown_side_by_side, repo),
        "graph-kernels": partial(doc_recipes.graph_kernels, repo),
        "headline": partial(doc_claims.headline, repo),
        "accounting-memory": doc_accounting.config_memory_table,
        "accounting-checkpointing": doc_accounting.checkpointing_table,
        "accounting-xxl": doc_accounting.xxl_table,
        "accounting-communication": doc_accounting.communication_table,
        "dp-scaling": partial(doc_dp_scaling.dp_scaling, repo),
    }
