"""The decoder-only Transformer language model."""

from __future__ import annotations

import torch
from torch import nn

from systems.model.config import ModelConfig
from systems.model.layers import RMSNorm, RotaryEmbedding, TransformerBlock, linear


class TransformerLM(nn.Module):
    """Token embedding, `num_layers` pre-norm blocks, final RMSNorm, untied LM head.

    `attention` names the attention backend (see `systems.attention.ATTENTION_BACKENDS`).
    """

    def __init__(self, config: ModelConfig, attention: str = "reference") -> None:
        super().__init__()
        self.config = config
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.trunc_normal_(self.token_embeddings.weight, std=1.0, a=-3.0, b=3.0)
        # One rotary table shared by all layers; it holds only non-persistent buffers.
        rope = RotaryEmbedding(config.head_dim, config.context_length, config.rope_theta)
        self.layers = nn.ModuleList(
            TransformerBlock(config.d_model, config.num_heads, config.d_ff, rope, attention)
            for _ in range(config.num_layers)
        )
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = linear(config.d_model, config.vocab_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids: (batch, seq) integers -> logits (batch, seq, vocab)."""
        if token_ids.dim() != 2:
            raise ValueError(f"token_ids must be (batch, seq), got shape {tuple(token_ids.shape)}")
        seq_len = token_ids.shape[1]
        if seq_len > self.config.context_length:
            raise ValueError(
                f"sequence length {seq_len} exceeds the model's context_length "
                f"{self.config.context_length}"
            )
        positions = torch.arange(seq_len, device=token_ids.device)
        x = self.token_embeddings(token_ids)
        for layer in self.layers:
            x = layer(x, positions)
        return self.lm_head(self.ln_final(x))
