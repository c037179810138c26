"""The causal mask, defined once for every PyTorch-side implementation.

Query i sees keys 0..i: queries and keys are aligned at position 0, also when their
lengths differ. The Triton kernels apply the same rule inside their tiles
(`kernels.sees`), and flex_attention through `causal_mask_mod`.
"""

from __future__ import annotations

import torch

# What the flash implementations write for a masked score instead of -inf: a row whose
# every score is masked then never computes exp(-inf - -inf).
MASKED_SCORE = -1.0e6


def query_sees_key(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The rule itself, on (broadcastable) query and key positions."""
    return query >= key


def causal_mask(n_queries: int, n_keys: int, device: torch.device | str | None = None,
                q_start: int = 0, k_start: int = 0) -> torch.Tensor:
    """(n_queries, n_keys) bool, True where query q_start + i may see key k_start + j.

    The starts place a tile of queries and a tile of keys inside the whole sequence."""
    queries = torch.arange(q_start, q_start + n_queries, device=device)[:, None]
    keys = torch.arange(k_start, k_start + n_keys, device=device)[None, :]
    return query_sees_key(queries, keys)


def causal_mask_mod(batch: torch.Tensor, head: torch.Tensor, q_idx: torch.Tensor,
                    kv_idx: torch.Tensor) -> torch.Tensor:
    """The causal mask as flex_attention's mask_mod."""
    return query_sees_key(q_idx, kv_idx)
