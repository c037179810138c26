"""End-to-end model workloads (forward, forward+backward, train step) and their FLOPs: the
steps `systems.model.train_step` builds, with what a timer needs beside them."""

from __future__ import annotations

from dataclasses import dataclass

from systems.accounting import attention_flops
from systems.model import ModelConfig
from systems.model.recipes import Recipe
from systems.model.train_step import MODES, ModelStep, build_model_step, check_choice

# Backward costs two forwards (grads w.r.t. activations and weights); AdamW is negligible.
_FLOP_MULTIPLIER = {"forward": 1, "forward_backward": 3, "train_step": 3}


def forward_flops(config: ModelConfig, batch_size: int, seq_len: int) -> float:
    """Matmul FLOPs of one forward pass (2 per multiply-add; full, unmasked attention).

    Counts the projections, SwiGLU, both attention matmuls and the LM head; ignores norms,
    softmax and elementwise work. This is the usual 'model FLOPs' convention.
    """
    d, f, n = config.d_model, config.d_ff, config.num_layers
    per_token = 2 * (n * (4 * d * d + 3 * d * f) + d * config.vocab_size)
    attention = attention_flops(n * batch_size * config.num_heads, seq_len, seq_len,
                                config.head_dim, is_causal=False)
    return float(batch_size * seq_len * per_token + attention)


def workload_flops(config: ModelConfig, batch_size: int, seq_len: int, mode: str) -> float:
    check_choice("mode", mode, MODES)
    return _FLOP_MULTIPLIER[mode] * forward_flops(config, batch_size, seq_len)


@dataclass
class ModelWorkload(ModelStep):
    """A `ModelStep` with the work one step does: its FLOPs and tokens."""

    @property
    def flops(self) -> float:
        return workload_flops(self.config, self.batch_size, self.seq_len, self.mode)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


def build_model_workload(config: ModelConfig, **settings: object) -> ModelWorkload:
    """`build_model_step(config, **settings)` (a random model and batch, one step of a
    mode), as a workload."""
    return ModelWorkload(**vars(build_model_step(config, **settings)))


def build_recipe_workload(config: ModelConfig, recipe: Recipe,
                          **settings: object) -> ModelWorkload:
    """A step of `config` (a train step unless `mode` says otherwise) run the way `recipe`
    says; same seed, same weights and batch whatever the recipe. `settings`: batch_size,
    seq_len, device, seed, mode, as `build_model_step` takes them."""
    return build_model_workload(config, precision=recipe.precision, compiled=recipe.compiled,
                                attention=recipe.attention, options=recipe.options, **settings)
