"""The decoder-only Transformer language model."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from systems.model.config import ModelConfig
from systems.model.layers import RMSNorm, RotaryEmbedding, TransformerBlock, linear
from systems.model.loss import DEFAULT_CHUNK_TOKENS, linear_cross_entropy


class TransformerLM(nn.Module):
    """Token embedding, `num_layers` pre-norm blocks, final RMSNorm, untied LM head.

    `attention` names the attention backend (see `systems.attention.ATTENTION_BACKENDS`).
    Activation checkpointing, off by default (everything saved for backward):
    `checkpoint_every` > 0 keeps only every that many blocks' input for backward and
    recomputes all blocks, a segment at a time; `checkpoint_blocks` > 0 recomputes only the
    first that many blocks, each on its own, and the others save their activations (less
    recomputation where the memory allows it). At most one of the two is set.
    """

    def __init__(self, config: ModelConfig, attention: str = "reference",
                 checkpoint_every: int = 0, checkpoint_blocks: int = 0) -> None:
        super().__init__()
        for name, value in (("checkpoint_every", checkpoint_every),
                            ("checkpoint_blocks", checkpoint_blocks)):
            if not 0 <= value <= config.num_layers:
                raise ValueError(
                    f"{name} must lie in [0, {config.num_layers}], got {value}")
        if checkpoint_every and checkpoint_blocks:
            raise ValueError("set checkpoint_every or checkpoint_blocks, not both (got "
                             f"{checkpoint_every} and {checkpoint_blocks})")
        self.config = config
        self.checkpoint_every = checkpoint_every
        self.checkpoint_blocks = checkpoint_blocks
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.trunc_normal_(self.token_embeddings.weight, std=1.0, a=-3.0, b=3.0)
        # One rotary table shared by all layers; it holds only non-persistent buffers.
        rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_theta)
        self.layers = nn.ModuleList(
            TransformerBlock(config.d_model, config.num_heads, config.d_ff, rope, attention)
            for _ in range(config.num_layers)
        )
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = linear(config.d_model, config.vocab_size)

    def forward(self, token_ids: torch.Tensor, targets: torch.Tensor | None = None,
                chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
        """token_ids: (batch, seq) integers -> logits (batch, seq, vocab).

        With `targets` (batch, seq), returns instead the mean cross-entropy through the
        chunked LM head (`systems.model.loss`), which never holds the full logits.
        """
        hidden = self.ln_final(self._blocks(token_ids))
        if targets is None:
            return self.lm_head(hidden)
        return linear_cross_entropy(hidden, self.lm_head.weight, targets, chunk_tokens)

    def _blocks(self, token_ids: torch.Tensor) -> torch.Tensor:
        if token_ids.dim() != 2:
            raise ValueError(f"token_ids must be (batch, seq), got shape {tuple(token_ids.shape)}")
        seq_len = token_ids.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {seq_len} exceeds the model's max_seq_len "
                f"{self.config.max_seq_len}"
            )
        positions = torch.arange(seq_len, device=token_ids.device)
        x = self.token_embeddings(token_ids)
        for segment, recompute in self._segments():
            if recompute and torch.is_grad_enabled():
                # The model draws no random numbers, so there is no RNG state to replay (and
                # reading it is not allowed while a CUDA graph is being captured).
                x = checkpoint(_run_segment, segment, x, positions, use_reentrant=False,
                               preserve_rng_state=False)
            else:
                x = _run_segment(segment, x, positions)
        return x

    def _segments(self) -> list[tuple[nn.ModuleList, bool]]:
        """The blocks in order, in runs that are recomputed in backward or not."""
        layers, every, first = self.layers, self.checkpoint_every, self.checkpoint_blocks
        if every:
            return [(layers[i:i + every], True) for i in range(0, len(layers), every)]
        recomputed = [(layers[i:i + 1], True) for i in range(first)]
        return recomputed + ([(layers[first:], False)] if first < len(layers) else [])


def _run_segment(layers: nn.ModuleList, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x, positions)
    return x
