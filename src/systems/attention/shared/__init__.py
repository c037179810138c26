"""Pieces every attention implementation shares: the causal mask, input checks, autograd helpers."""
