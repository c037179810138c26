"""NVTX ranges that cost nothing where CUDA is absent."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """Mark a named range for Nsight Systems; a no-op on CPU-only builds."""
    if not torch.cuda.is_available():
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
