"""Cross-entropy over the vocabulary, computed in fp32 for stability."""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all positions of -log softmax(logits)[target].

    logits: (..., vocab), targets: (...) integer class indices.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match"
        )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # never below fp32
    target_logits = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(logits, dim=-1) - target_logits).mean()
