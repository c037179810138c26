"""Markdown tables of the analytic models in `systems.accounting` (no measurements needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from systems import accounting as acc
from systems.common.formatting import fmt, markdown_table
from systems.model import MODEL_CONFIGS

_GIB = 2**-30
BATCH, CONTEXT = 4, 512  # the shape of the end-to-end benchmarks


def config_memory_table() -> str:
    rows = []
    for name, c in MODEL_CONFIGS.items():
        if name == "tiny":
            continue
        fp32 = acc.step_memory(c, BATCH, CONTEXT, "fp32")
        bf16 = acc.step_memory(c, BATCH, CONTEXT, "bf16")
        rows.append([name, fmt(c.num_parameters(), ".0f", 1e-6), fmt(fp32.parameters, ".2f", _GIB),
                     fmt(fp32.gradients, ".2f", _GIB), fmt(fp32.optimizer_state, ".2f", _GIB),
                     fmt(fp32.activations, ".2f", _GIB), fmt(bf16.activations, ".2f", _GIB),
                     fmt(fp32.peak, ".2f", _GIB), fmt(bf16.peak, ".2f", _GIB)])
    return markdown_table(
        ["size", "params (M)", "params GiB", "grads GiB", "AdamW GiB", "activations fp32 GiB",
         "activations bf16 GiB", "peak fp32 GiB", "peak bf16 GiB"], rows)


def checkpointing_table() -> str:
    rows = []
    for name in ("xl", "2.7b"):
        c = MODEL_CONFIGS[name]
        layer = acc.layer_activation_bytes(c, BATCH, CONTEXT)
        boundary = acc.residual_stream_bytes(c, BATCH, CONTEXT)
        sqrt_n = max(1, round(math.sqrt(c.num_layers)))
        best = acc.best_checkpoint_segment(layer, boundary, c.num_layers)
        rows.append([name, c.num_layers, fmt(layer * c.num_layers, ".2f", _GIB), sqrt_n,
                     fmt(acc.checkpointed_activation_bytes(layer, boundary, c.num_layers, sqrt_n),
                         ".2f", _GIB), best,
                     fmt(acc.checkpointed_activation_bytes(layer, boundary, c.num_layers, best),
                         ".2f", _GIB)])
    return markdown_table(["size", "layers", "block activations GiB", "sqrt(L) segment",
                           "checkpointed GiB", "best segment", "best checkpointed GiB"], rows)


def xxl_table(device_bytes: Sequence[tuple[str, int]] = (("H100 80GB", 80 * 10**9),
                                                          ("TPU v5p 95GB", 95 * 10**9))) -> str:
    model = acc.FFNStack()
    rows = []
    for tokens in (1, 1024, 16384):
        rows.append([f"{tokens:,}", fmt(model.state_bytes(), ".1f", 1e-9),
                     fmt(model.activation_bytes(tokens), ".2f", 1e-9),
                     *(model.min_fsdp_devices(tokens, limit) or "none fits"
                       for _, limit in device_bytes)])
    header = (f"FFN stack d_model {model.d_model}, d_ff {model.d_ff}, {model.num_blocks} blocks: "
              f"{model.parameters / 1e9:.1f} B parameters; fp32 weights + grads + AdamW = "
              f"{model.state_bytes() / 1e12:.2f} TB "
              f"({model.state_bytes() / (80 * 10**9):.0f} H100s of 80 GB).\n")
    return header + "\n" + markdown_table(
        ["tokens", "state GB", "bf16 activations GB",
         *(f"min FSDP devices ({label})" for label, _ in device_bytes)], rows)


def communication_table(world_sizes: Sequence[int] = (2, 4, 8)) -> str:
    rows = []
    for name in ("xl", "2.7b"):
        param_bytes = MODEL_CONFIGS[name].num_parameters() * acc.FP32
        for n in world_sizes:
            rows.append([name, n, *(fmt(acc.data_parallel_bytes_per_step(param_bytes, n, s),
                                        ".2f", 1e-9)
                                    for s in ("ddp", "sharded_optimizer", "zero1"))])
    return markdown_table(["size", "ranks", "DDP GB/rank", "sharded optimizer GB/rank",
                           "ZeRO-1 GB/rank"], rows)
