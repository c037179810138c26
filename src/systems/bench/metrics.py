"""Derived throughput numbers recorded with every measurement, and the compact table (time,
TFLOP/s, MFU, tokens/s, memory, host share) that shows them for finished benchmarks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from systems.common.formatting import fmt
from systems.common.hardware import peak_tflops
from systems.runs import keys
from systems.runs.gate import Timing


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
    """True for CUDA OOM errors, including those re-raised by torch.compile / Triton, and for
    Triton's "out of resource" (a kernel needs more shared memory or registers per block
    than this GPU has): both are properties of the workload on this device."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return ("out of memory" in text.lower() or "OutOfMemoryError" in text
            or "out of resource" in text.lower())


def out_of_memory_reason(error: BaseException) -> str:
    """The skip reason recorded for a workload that does not fit on the device."""
    first = str(error).splitlines()[0][:200]
    if "out of resource" in first.lower():
        return f"out of resource on this GPU (a property of this workload): {first}"
    return f"out of memory (a property of this workload): {first}"


@dataclass(frozen=True)
class BenchmarkResult:
    """What one benchmark fixture measured, taken from its public attributes."""

    name: str
    fullname: str
    mean: float
    timing: Timing
    extra_info: Mapping[str, object]

    @classmethod
    def of(cls, bench) -> BenchmarkResult:
        """From a pytest-benchmark fixture that has run (its `stats` is set)."""
        stats = bench.stats.stats
        extra_info = dict(bench.extra_info)
        return cls(bench.name, bench.fullname, stats.mean,
                   Timing.from_saved({"median": stats.median, "iqr": stats.iqr}, extra_info),
                   extra_info)


def throughput_table(results: Iterable[BenchmarkResult]) -> str:
    """Finished benchmarks -> aligned text table, by name."""
    rows = sorted(((r.name, r.mean, r.extra_info) for r in results), key=lambda r: r[0])
    if not rows:
        return ""
    width = max(len(name) for name, _, _ in rows)
    header = (f"{'benchmark':<{width}}  {'mean ms':>10}  {'TFLOP/s':>8}  {'MFU':>6}  "
              f"{'tokens/s':>10}  {'peak GiB':>8}  {'host':>5}")
    lines = [header, "-" * len(header)]
    for name, mean, info in rows:
        # Host time until the step returned, as a share of the round: near 100% on a GPU
        # means the device waited on launches.
        enqueue = info.get(keys.HOST_ENQUEUE_S)
        host = None if enqueue is None or not mean else enqueue / mean
        lines.append(
            f"{name:<{width}}  {mean * 1e3:>10.2f}  {fmt(info.get('tflops'), '.3g'):>8}  "
            f"{fmt(info.get('mfu'), '.1%'):>6}  {fmt(info.get('tokens_per_s'), ',.0f'):>10}  "
            f"{fmt(info.get('peak_memory_gib'), '.2f'):>8}  {fmt(host, '.0%'):>5}"
        )
    return "\n".join(lines)
