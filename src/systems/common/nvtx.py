"""NVTX ranges that cost nothing where CUDA is absent, mirrored into torch.profiler traces."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.autograd import profiler as autograd_profiler


def _profiler_range(name: str):
    # torch.profiler cannot see NVTX ranges; a record_function while it runs lets the
    # kernel summary attribute kernels to phases. The flag check keeps it free otherwise.
    if getattr(autograd_profiler, "_is_profiler_enabled", False):
        return torch.profiler.record_function(name)
    return nullcontext()


def _nvtx_available() -> bool:
    return torch.cuda.is_available()


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """Mark a named range for Nsight Systems; a no-op on CPU-only builds and inside code
    that torch.compile traces: Dynamo cannot trace the NVTX calls and would split the
    graph around every range (compiled code runs as its own kernels, so the range would
    not mark them anyway)."""
    if torch.compiler.is_compiling():
        yield
        return
    with _profiler_range(name):
        if not _nvtx_available():
            yield
            return
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
