"""Analytic memory and FLOP models for training our Transformer LMs.

Sizes are in bytes. "Activations" are the tensors autograd saves for backward, counted once
per storage (what is alive at the end of the forward pass), as our `TransformerLM` saves
them; `tests/correctness/bench/test_accounting.py` checks the count against saved-tensor
hooks. docs/accounting.md tabulates them for our model sizes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from systems.model import ModelConfig

FP32, BF16, INT64, BOOL = 4, 2, 8, 1
ADAMW_STATES = 2  # first and second moment, each the size of the parameters


# ----------------------------------------------------------------------------- activations
@dataclass(frozen=True)
class SavedTensor:
    """`count` tensors of `elements` elements of `itemsize` bytes, saved per layer or once."""

    name: str
    elements: int
    itemsize: int
    count: int = 1
    per_layer: bool = True

    @property
    def bytes(self) -> int:
        return self.elements * self.itemsize * self.count


def saved_tensors(
    config: ModelConfig, batch_size: int, seq_len: int, precision: str = "fp32",
    softmax_in_fp32: bool = True, scores_saved: bool = True,
) -> list[SavedTensor]:
    """What one training forward of `TransformerLM` (reference attention) keeps for backward.

    precision: "fp32" or "bf16" (autocast). Under bf16 the residual stream and RMSNorm stay
    fp32, every linear saves its own bf16 copy of its input and autocast keeps bf16 copies of
    the weights. `softmax_in_fp32`: CUDA autocast runs softmax in fp32 (CPU autocast does
    not), so the probabilities are saved in fp32 and again as the bf16 input of `probs @ v`.
    `scores_saved=False` models a flash-style attention instead: no mask and no
    probabilities, one fp32 log-sum-exp per query and head.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    c = config
    n, d, f = batch_size * seq_len, c.d_model, c.d_ff
    scores = batch_size * c.num_heads * seq_len * seq_len
    act = FP32 if precision == "fp32" else BF16
    tensors = [
        # Each RMSNorm saves its fp32 input and normalised input (before the gain), and 1/rms.
        SavedTensor("rmsnorm input + normalised", n * d, FP32, count=4),
        SavedTensor("rmsnorm 1/rms", n, FP32, count=2),
        SavedTensor("rope cos/sin tables", seq_len * c.head_dim // 2, FP32, count=4),
        SavedTensor("q, k after rope; v", n * d, act, count=3),
        *([SavedTensor("causal mask", seq_len * seq_len, BOOL),
           SavedTensor("attention probabilities", scores, act)] if scores_saved else
          [SavedTensor("attention log-sum-exp", n * c.num_heads, FP32)]),
        SavedTensor("output projection input", n * d, act),
        SavedTensor("SwiGLU w1 x, silu(w1 x), w3 x, product", n * f, act, count=4),
        SavedTensor("lm head logits (fp32 for the loss)", n * c.vocab_size, FP32, per_layer=False),
        SavedTensor("final rmsnorm input + normalised", n * d, FP32, count=2, per_layer=False),
        SavedTensor("final 1/rms, log-sum-exp", n, FP32, count=2, per_layer=False),
        SavedTensor("token ids and targets", n, INT64, count=2, per_layer=False),
    ]
    if precision == "fp32":
        # The attention and FFN inputs are the RMSNorm outputs themselves; the LM head's too.
        tensors += [SavedTensor("attention and FFN inputs", n * d, FP32, count=2),
                    SavedTensor("lm head input", n * d, FP32, per_layer=False)]
        return tensors
    tensors += [
        # q/k/v projections cast their shared input separately, and so do w1 and w3.
        SavedTensor("bf16 casts of projection inputs", n * d, BF16, count=5),
        SavedTensor("bf16 cast of lm head input", n * d, BF16, per_layer=False),
        SavedTensor("bf16 weight copies (autocast cache)", 4 * d * d + 3 * d * f, BF16),
        SavedTensor("bf16 lm head weight copy", d * c.vocab_size, BF16, per_layer=False),
    ]
    if softmax_in_fp32 and scores_saved:
        tensors.append(SavedTensor("fp32 softmax output", scores, FP32))
    return tensors


def activation_bytes(
    config: ModelConfig, batch_size: int, seq_len: int, precision: str = "fp32",
    softmax_in_fp32: bool = True, scores_saved: bool = True,
) -> int:
    """Total bytes saved for backward by one training forward (see `saved_tensors`)."""
    tensors = saved_tensors(config, batch_size, seq_len, precision, softmax_in_fp32,
                            scores_saved)
    return sum(t.bytes * (config.num_layers if t.per_layer else 1) for t in tensors)


def layer_activation_bytes(
    config: ModelConfig, batch_size: int, seq_len: int, precision: str = "fp32",
    softmax_in_fp32: bool = True, scores_saved: bool = True,
) -> int:
    """Bytes one Transformer block saves for backward."""
    tensors = saved_tensors(config, batch_size, seq_len, precision, softmax_in_fp32,
                            scores_saved)
    return sum(t.bytes for t in tensors if t.per_layer)


def residual_stream_bytes(config: ModelConfig, batch_size: int, seq_len: int) -> int:
    """One (batch, seq, d_model) fp32 tensor: the residual stream (fp32 under autocast too)."""
    return batch_size * seq_len * config.d_model * FP32


# -------------------------------------------------------------------- training-state memory
@dataclass(frozen=True)
class StepMemory:
    """Bytes of the pieces of one step's memory on one device, and the two moments when
    most of them are alive at once."""

    parameters: int
    gradients: int
    optimizer_state: int
    optimizer_temporaries: int
    activations: int

    @property
    def backward_start(self) -> int:
        # Gradients were set to None before the forward, so none exist yet.
        return self.parameters + self.optimizer_state + self.activations

    @property
    def optimizer_step(self) -> int:
        return (self.parameters + self.gradients + self.optimizer_state
                + self.optimizer_temporaries)

    @property
    def peak(self) -> int:
        """The larger of the two moments: a lower bound of the measured peak, which adds
        transients such as the logits' gradient and allocator rounding."""
        return max(self.backward_start, self.optimizer_step)


def step_memory(
    config: ModelConfig, batch_size: int, seq_len: int, precision: str = "fp32",
    mode: str = "train_step", softmax_in_fp32: bool = True, scores_saved: bool = True,
) -> StepMemory:
    """fp32 parameters, gradients, AdamW moments (train_step only) and saved activations.

    Our AdamW computes sqrt(v) for all parameters at once, so its step briefly holds one
    more parameter-sized buffer. A no-grad "forward" holds only the parameters (plus
    transients this model ignores).
    """
    params = config.num_parameters() * FP32
    training = mode != "forward"
    stepping = mode == "train_step"
    return StepMemory(
        parameters=params,
        gradients=params if training else 0,
        optimizer_state=ADAMW_STATES * params if stepping else 0,
        optimizer_temporaries=params if stepping else 0,
        activations=activation_bytes(config, batch_size, seq_len, precision, softmax_in_fp32,
                                     scores_saved) if training else 0,
    )


# ------------------------------------------------------------------ activation checkpointing
def checkpoint_blocks_for_budget(
    config: ModelConfig, batch_size: int, seq_len: int, precision: str, budget_bytes: int,
    scores_saved: bool = True,
) -> int:
    """The fewest blocks to recompute, each on its own (`TransformerLM(checkpoint_blocks=k)`),
    for `step_memory` of a train step to fit in `budget_bytes`; every block when none fits.

    A recomputed block keeps only its input (the residual stream). The recomputed blocks
    are the first ones, whose backward runs last, when the later blocks' activations are
    already freed, so recomputing adds nothing to the peak at the start of backward.
    Fewer recomputed blocks, less recompute time.
    The model is that of the eager model (`saved_tensors`), which a compiled step
    undercuts, so the choice errs towards recomputing more.
    """
    layer = layer_activation_bytes(config, batch_size, seq_len, precision,
                                   scores_saved=scores_saved)
    boundary = residual_stream_bytes(config, batch_size, seq_len)
    memory = step_memory(config, batch_size, seq_len, precision, scores_saved=scores_saved)
    for blocks in range(config.num_layers + 1):
        saved = memory.activations - blocks * (layer - boundary)
        if replace(memory, activations=saved).peak <= budget_bytes:
            return blocks
    return config.num_layers


def checkpointed_activation_bytes(layer_bytes: int, boundary_bytes: int, num_layers: int,
                                  segment: int) -> int:
    """Peak saved activations keeping every `segment`-th block input, recomputing one segment."""
    if not 1 <= segment <= num_layers:
        raise ValueError(f"segment must lie in [1, {num_layers}], got {segment}")
    return math.ceil(num_layers / segment) * boundary_bytes + segment * layer_bytes


def best_checkpoint_segment(layer_bytes: int, boundary_bytes: int, num_layers: int) -> int:
    """The segment length for which `checkpointed_activation_bytes` is least."""
    return min(range(1, num_layers + 1), key=lambda s: checkpointed_activation_bytes(
        layer_bytes, boundary_bytes, num_layers, s))


# ------------------------------------------------------------ sharding and communication
# Bytes a rank sends per step in ring collectives, in all-gathers of the parameters: DDP
# all-reduces the gradients (two), a sharded optimizer then broadcasts the parameters
# (three), ZeRO-1 reduce-scatters the gradients and all-gathers the parameters (two).
GATHERS = {"ddp": 2, "sharded_optimizer": 3, "zero1": 2}


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
        return self.parameters * FP32 * (2 + ADAMW_STATES)

    def activation_bytes(self, tokens: int) -> int:
        """bf16 tensors saved for backward: each block's input and its hidden activation."""
        return tokens * self.num_blocks * (self.d_model + self.d_ff) * BF16

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
    """Bytes one rank sends per step under `scheme` (a key of `GATHERS`)."""
    if world_size < 1 or scheme not in GATHERS:
        raise ValueError(f"need world_size >= 1 and a scheme of {sorted(GATHERS)}, got "
                         f"{world_size} and {scheme!r}")
    return GATHERS[scheme] * param_bytes * (world_size - 1) / world_size


# ------------------------------------------------------------------------------- FLOP counts
SOFTMAX_FLOPS_PER_SCORE = 5  # max, subtract, exp, sum, divide
# Backward recomputes nothing in this count and does 2.5 forwards' matmuls (dV, dP, dQ, dK
# against QK^T and PV): the usual convention for attention FLOPs.
ATTENTION_MODE_FLOPS = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}


def attention_flops(batch_heads: int, n_queries: int, n_keys: int, head_dim: int,
                    is_causal: bool, mode: str = "forward") -> float:
    """Matmul FLOPs of attention over `batch_heads` (q, k, v) matrices: 4 * BH * n_q * n_k *
    d for a forward (QK^T and PV, 2 per multiply-add), halved under the causal mask, times
    `ATTENTION_MODE_FLOPS[mode]`. Softmax and masking are elementwise and not counted."""
    if mode not in ATTENTION_MODE_FLOPS:
        raise ValueError(f"unknown mode {mode!r}; choose one of {sorted(ATTENTION_MODE_FLOPS)}")
    forward = 4.0 * batch_heads * n_queries * n_keys * head_dim / (2 if is_causal else 1)
    return forward * ATTENTION_MODE_FLOPS[mode]


def reference_attention_part_flops(config: ModelConfig, batch_size: int,
                                   seq_len: int) -> dict[str, float]:
    """FLOPs of one forward through all layers' reference attention, split as it is profiled.

    The reference implementation computes the full (unmasked) score matrix, so the causal
    mask does not halve these counts. Scaling and masking are elementwise and not counted.
    """
    batch_heads = config.num_layers * batch_size * config.num_heads
    matmul = attention_flops(batch_heads, seq_len, seq_len, config.head_dim, False) / 2
    return {"attention_scores": matmul, "attention_softmax": float(
        SOFTMAX_FLOPS_PER_SCORE * batch_heads * seq_len * seq_len),
        "attention_final_matmul": matmul}
