"""docs/accounting.md's blocks: sizing models computed from our configs, nothing measured."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from systems import accounting as acc
from systems.common.formatting import fmt, markdown_table
from systems.model import MODEL_CONFIGS

BATCH, CONTEXT = 4, 512  # the shape of the end-to-end benchmarks
# Bytes a rank sends per step in ring collectives, in all-gathers of the parameters: DDP
# all-reduces the gradients (two), a sharded optimizer then broadcasts the parameters
# (three), ZeRO-1 reduce-scatters the gradients and all-gathers the parameters (two).
GATHERS = {"ddp": 2, "sharded_optimizer": 3, "zero1": 2}


def checkpointed_activation_bytes(layer_bytes: int, boundary_bytes: int, num_layers: int,
                                  segment: int) -> int:
    """Peak saved activations keeping every `segment`-th block input, recomputing one segment."""
    if not 1 <= segment <= num_layers:
        raise ValueError(f"segment must lie in [1, {num_layers}], got {segment}")
    return math.ceil(num_layers / segment) * boundary_bytes + segment * layer_bytes


def best_checkpoint_segment(layer_bytes: int, boundary_bytes: int, num_layers: int) -> int:
    return min(range(1, num_layers + 1), key=lambda s: checkpointed_activation_bytes(
        layer_bytes, boundary_bytes, num_layers, s))


@dataclass(frozen=True)
class FFNStack:
    """A stack of two-matmul FFN blocks (d_model -> d_ff -> d_model, no biases)."""

    d_model: int = 16384
    d_ff: int = 53248
    num_blocks: int = 126

    @property
    def parameters(self) -> int:
        return self.num_blocks * 2 * self.d_model * self.d_ff

    def state_bytes(self) -> int:
        """fp32 master weights, gradients and the two AdamW moments."""
        return self.parameters * acc.FP32 * (2 + acc.ADAMW_STATES)

    def activation_bytes(self, tokens: int) -> int:
        """bf16 tensors saved for backward: each block's input and its hidden activation."""
        return tokens * self.num_blocks * (self.d_model + self.d_ff) * acc.BF16

    def fsdp_bytes_per_device(self, tokens: int, devices: int) -> int:
        """State and half the activations sharded over `devices`; the other half replicated."""
        half = self.activation_bytes(tokens) / 2
        return math.ceil(self.state_bytes() / devices + half / devices + half)

    def min_fsdp_devices(self, tokens: int, device_bytes: int) -> int | None:
        """None where the replicated half of the activations alone fills a device."""
        if self.activation_bytes(tokens) / 2 >= device_bytes:
            return None
        return next(n for n in itertools.count(1)
                    if self.fsdp_bytes_per_device(tokens, n) <= device_bytes)


def data_parallel_bytes_per_step(param_bytes: float, world_size: int, scheme: str) -> float:
    if world_size < 1 or scheme not in GATHERS:
        raise ValueError(f"need world_size >= 1 and a scheme of {sorted(GATHERS)}, got "
                         f"{world_size} and {scheme!r}")
    return GATHERS[scheme] * param_bytes * (world_size - 1) / world_size


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
                                 best_checkpoint_segment(layer, boundary, c.num_layers))
            for cell in (segment, _gib(
                checkpointed_activation_bytes(layer, boundary, c.num_layers, segment))))])
    return markdown_table(["size", "layers", "block activations GiB", "sqrt(L) segment",
                           "checkpointed GiB", "best segment", "best checkpointed GiB"], rows)


def xxl_table(device_bytes: Sequence[tuple[str, int]] = (("H100 80GB", 80 * 10**9),
                                                          ("TPU v5p 95GB", 95 * 10**9))) -> str:
    model = FFNStack()
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
    rows = [[name, n, *(fmt(data_parallel_bytes_per_step(
                MODEL_CONFIGS[name].num_parameters() * acc.FP32, n, s), ".2f", 1e-9)
                for s in GATHERS)]
            for name in ("xl", "2.7b") for n in world_sizes]
    return markdown_table(["size", "ranks", "DDP GB/rank", "sharded optimizer GB/rank",
                           "ZeRO-1 GB/rank"], rows)
