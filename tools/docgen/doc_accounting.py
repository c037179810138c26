"""docs/accounting.md's blocks: `systems.accounting`'s models over our configs, nothing
measured."""

from __future__ import annotations

import math
from collections.abc import Sequence

from systems import accounting as acc
from systems.common.formatting import fmt, markdown_table
from systems.model import MODEL_CONFIGS

BATCH, CONTEXT = 4, 512  # the shape of the end-to-end benchmarks


def _gib(value: float) -> str:
    return fmt(value, ".2f", 2**-30)


def config_memory_table() -> str:
    rows = [[name, fmt(c.num_parameters(), ".0f", 1e-6), *map(_gib, (
        fp32.parameters, fp32.gradients, fp32.optimizer_state, fp32.activations, bf16.activations,
        fp32.peak, bf16.peak))] for name, c in MODEL_CONFIGS.items() if name != "tiny"
        for fp32, bf16 in [[acc.step_memory(c, BATCH, CONTEXT, p) for p in ("fp32", "bf16")]]]
    return markdown_table(
        ["size", "params (M)", "params GiB", "grads GiB", "AdamW GiB", "activations fp32 GiB",
         "activations bf16 GiB", "peak fp32 GiB", "peak bf16 GiB"], rows)


def checkpointing_table() -> str:
    rows = []
    for name in ("xl", "2.7b"):
        c = MODEL_CONFIGS[name]
        layer, boundary = (size(c, BATCH, CONTEXT) for size in (acc.layer_activation_bytes,
                                                                acc.residual_stream_bytes))
        rows.append([name, c.num_layers, _gib(layer * c.num_layers), *(
            cell for segment in (max(1, round(math.sqrt(c.num_layers))),
                                 acc.best_checkpoint_segment(layer, boundary, c.num_layers))
            for cell in (segment, _gib(
                acc.checkpointed_activation_bytes(layer, boundary, c.num_layers, segment))))])
    return markdown_table(["size", "layers", "block activations GiB", "sqrt(L) segment",
                           "checkpointed GiB", "best segment", "best checkpointed GiB"], rows)


def xxl_table(device_bytes: Sequence[tuple[str, int]] = (("H100 80GB", 80 * 10**9),
                                                          ("TPU v5p 95GB", 95 * 10**9))) -> str:
    model = acc.FFNStack()
    rows = [[f"{tokens:,}", fmt(model.state_bytes(), ".1f", 1e-9),
             fmt(model.activation_bytes(tokens), ".2f", 1e-9),
             *(model.min_fsdp_devices(tokens, limit) or "none fits" for _, limit in device_bytes)]
            for tokens in (1, 1024, 16384)]
    header = (f"FFN stack d_model {model.d_model}, d_ff {model.d_ff}, {model.num_blocks} blocks: "
              f"{model.parameters / 1e9:.1f} B parameters; fp32 weights + grads + AdamW = "
              f"{model.state_bytes() / 1e12:.2f} TB "
              f"({model.state_bytes() / (80 * 10**9):.0f} H100s of 80 GB).\n")
    return header + "\n" + markdown_table(
        ["tokens", "state GB", "bf16 activations GB",
         *(f"min FSDP devices ({label})" for label, _ in device_bytes)], rows)


def communication_table(world_sizes: Sequence[int] = (2, 4, 8)) -> str:
    rows = [[name, n, *(fmt(acc.data_parallel_bytes_per_step(
                MODEL_CONFIGS[name].num_parameters() * acc.FP32, n, s), ".2f", 1e-9)
                for s in acc.GATHERS)]
            for name in ("xl", "2.7b") for n in world_sizes]
    return markdown_table(["size", "ranks", "DDP GB/rank", "sharded optimizer GB/rank",
                           "ZeRO-1 GB/rank"], rows)
