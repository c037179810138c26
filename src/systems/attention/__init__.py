"""Attention implementations and the registry the model selects them from."""

from systems.attention.reference import reference_attention, sdpa_attention
from systems.attention.registry import ATTENTION_BACKENDS, get_attention

__all__ = ["ATTENTION_BACKENDS", "get_attention", "reference_attention", "sdpa_attention"]
