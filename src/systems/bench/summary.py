"""A compact throughput table (time, TFLOP/s, MFU, tokens/s, memory, host share) for
finished benchmarks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from systems.bench.gate import Timing
from systems.common.formatting import fmt


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
        enqueue = info.get("host_enqueue_s_median")
        host = None if enqueue is None or not mean else enqueue / mean
        lines.append(
            f"{name:<{width}}  {mean * 1e3:>10.2f}  {fmt(info.get('tflops'), '.3g'):>8}  "
            f"{fmt(info.get('mfu'), '.1%'):>6}  {fmt(info.get('tokens_per_s'), ',.0f'):>10}  "
            f"{fmt(info.get('peak_memory_gib'), '.2f'):>8}  {fmt(host, '.0%'):>5}"
        )
    return "\n".join(lines)
