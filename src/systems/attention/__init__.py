"""Attention implementations and the registry the model and benchmarks select them from."""

from systems.attention.flash_pytorch import FlashAttentionPytorch
from systems.attention.functions import FlashAttentionTriton, FlashAttentionTritonUnordered
from systems.attention.reference import reference_attention, sdpa_attention
from systems.attention.registry import ATTENTION_BACKENDS, get_attention, unsupported_reason

__all__ = [
    "ATTENTION_BACKENDS", "FlashAttentionPytorch", "FlashAttentionTriton",
    "FlashAttentionTritonUnordered", "get_attention",
    "reference_attention", "sdpa_attention", "unsupported_reason",
]
