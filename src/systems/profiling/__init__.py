"""Profiling helpers: NVTX ranges, torch.profiler summaries, memory snapshots."""

from systems.common.nvtx import nvtx_range

__all__ = ["nvtx_range"]
