"""Generated blocks of docs/accounting.md: analytic memory and communication models of our
models from their configs (no measurement is read), on `systems.accounting`'s counts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from systems import accounting as acc
from systems.common.formatting import fmt, markdown_table
from systems.model import MODEL_CONFIGS

BATCH, CONTEXT = 4, 512  # the shape of the end-to-end benchmarks


def checkpointed_activation_bytes(layer_bytes: int, boundary_bytes: int, num_layers: int,
                                  segment: int) -> int:
    """Peak saved activations keeping every `segment`-th block input: forward keeps
    ceil(L / segment) of them; backward recomputes one segment at a time."""
    if not 1 <= segment <= num_layers:
        raise ValueError(f"segment must lie in [1, {num_layers}], got {segment}")
    return math.ceil(num_layers / segment) * boundary_bytes + segment * layer_bytes


def best_checkpoint_segment(layer_bytes: int, boundary_bytes: int, num_layers: int) -> int:
    """The segment length minimising `checkpointed_activation_bytes` (about sqrt(L))."""
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
        """Fewest devices for which `fsdp_bytes_per_device` fits, or None if none does."""
        replicated = self.activation_bytes(tokens) / 2
        if replicated >= device_bytes:
            return None
        devices = math.ceil((self.state_bytes() + replicated) / (device_bytes - replicated))
        while self.fsdp_bytes_per_device(tokens, devices) > device_bytes:  # ceil rounding
            devices += 1
        return devices


def data_parallel_bytes_per_step(param_bytes: float, world_size: int, scheme: str) -> float:
    """Bytes each rank sends per step in ring collectives, in units of one all-gather (or
    reduce-scatter): "ddp" all-reduces the gradients (two), "sharded_optimizer" then
    broadcasts the updated parameters (three), "zero1" reduce-scatters the gradients and
    all-gathers the parameters (two)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    gathers = {"ddp": 2, "sharded_optimizer": 3, "zero1": 2}
    if scheme not in gathers:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {sorted(gathers)}")
    return gathers[scheme] * param_bytes * (world_size - 1) / world_size


def _gib(value: float) -> str:
    return fmt(value, ".2f", 2**-30)


def config_memory_table() -> str:
    rows = []
    for name, c in MODEL_CONFIGS.items():
        if name != "tiny":
            fp32, bf16 = (acc.step_memory(c, BATCH, CONTEXT, p) for p in ("fp32", "bf16"))
            rows.append([name, fmt(c.num_parameters(), ".0f", 1e-6),
                         *map(_gib, (fp32.parameters, fp32.gradients, fp32.optimizer_state,
                                     fp32.activations, bf16.activations, fp32.peak, bf16.peak))])
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
        best = best_checkpoint_segment(layer, boundary, c.num_layers)
        rows.append([name, c.num_layers, _gib(layer * c.num_layers), *(
            cell for segment in (sqrt_n, best) for cell in (segment, _gib(
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
                for s in ("ddp", "sharded_optimizer", "zero1"))]
            for name in ("xl", "2.7b") for n in world_sizes]
    return markdown_table(["size", "ranks", "DDP GB/rank", "sharded optimizer GB/rank",
                           "ZeRO-1 GB/rank"], rows)
