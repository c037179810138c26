"""Model hyperparameters and the named size presets."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a pre-norm decoder-only Transformer LM."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    max_seq_len: int = 2048
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        for field in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def with_overrides(self, **overrides: int | float) -> ModelConfig:
        return replace(self, **overrides)

    def num_parameters(self, include_embedding: bool = True) -> int:
        """Exact parameter count of `TransformerLM(self)`."""
        d, f = self.d_model, self.d_ff
        per_layer = 4 * d * d + 3 * d * f + 2 * d  # attention, SwiGLU, two RMSNorm gains
        count = self.num_layers * per_layer + d + self.vocab_size * d  # final norm, LM head
        if include_embedding:
            count += self.vocab_size * d
        return count


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_model=64, d_ff=192, num_layers=2, num_heads=4, vocab_size=512,
                        max_seq_len=256),
    "small": ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7b": ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


def get_config(name: str) -> ModelConfig:
    """Look up a preset by name with an error that lists the valid names."""
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ValueError(
            f"unknown model size {name!r}; choose one of {sorted(MODEL_CONFIGS)}"
        ) from None
