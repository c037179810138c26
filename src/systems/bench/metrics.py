"""Derived throughput numbers recorded with every measurement."""

from __future__ import annotations

import torch

from systems.common.hardware import peak_tflops


def throughput_metrics(
    *, seconds: float, flops: float | None, tokens: int | None, precision: str,
    device: torch.device | str,
) -> dict[str, float | None]:
    """TFLOP/s, model FLOP utilisation against the device's nominal peak, tokens/s."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    tflops = flops / seconds / 1e12 if flops else None
    peak = peak_tflops(precision, device)
    return {
        "flops": flops,
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if tflops is not None and peak else None,
        "tokens_per_s": tokens / seconds if tokens else None,
    }


def reset_peak_memory(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device | str) -> int | None:
    """Peak allocated bytes since the last reset; None where it cannot be measured (CPU)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return None


def allocated_memory_bytes(device: torch.device | str) -> int | None:
    """Bytes currently allocated by tensors on the device; None on CPU."""
    if torch.device(device).type == "cuda":
        return torch.cuda.memory_allocated(device)
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """True for CUDA OOM errors, including those re-raised by torch.compile / Triton."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return "out of memory" in text.lower() or "OutOfMemoryError" in text


def out_of_memory_reason(error: BaseException) -> str:
    """The skip reason recorded for a workload that does not fit on the device."""
    return f"out of memory (a property of this workload): {str(error).splitlines()[0][:200]}"
