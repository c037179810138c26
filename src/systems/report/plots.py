"""Matplotlib figures (Agg, PNG) of benchmark results; each returns None without data."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from systems.model import MODEL_CONFIGS  # noqa: E402
from systems.runs import keys  # noqa: E402
from systems.runs.history import Result  # noqa: E402


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _most_common(results: Sequence[Result], *fields: str) -> object:
    values = Counter(tuple(r.get(f) for f in fields) for r in results).most_common(1)[0][0]
    return values[0] if len(fields) == 1 else values


def _series_style(points: int, label: str, colour: object) -> dict:
    """Markers always; a line only through two or more points (one point is no trend)."""
    return {"marker": "o", "label": label, "color": colour,
            "linestyle": "-" if points > 1 else "none"}


def _newest_per_seq_len(points: Sequence[Result]) -> list[Result]:
    """One point per sequence length (the newest run's), sorted: a series of the latest
    results may hold the same length from two runs or studies, which would draw a
    vertical jump."""
    newest: dict[int, Result] = {}
    for r in sorted(points, key=lambda r: (r.datetime, r.file)):
        newest[r.get(keys.SEQ_LEN)] = r
    return [newest[n] for n in sorted(newest)]


def _time_axis_from_zero(ax, values_ms: Sequence[float]) -> None:
    """Time axes start at zero, so a 2% difference looks like 2%; the spread is written in
    the corner instead."""
    ax.set_ylim(0, max(values_ms) * 1.1)
    low, high = min(values_ms), max(values_ms)
    ax.text(0.02, 0.03, f"min {low:.1f} ms, max {high:.1f} ms (+{high / low - 1:.1%})",
            transform=ax.transAxes, fontsize=8)


def attention_scaling(results: Sequence[Result], path: Path) -> Path | None:
    """Time and peak memory vs sequence length, a line per implementation and a column per
    pass, at the most common dtype, head dim, masking and batch x heads."""
    rows = [r for r in results if r.kind == "attention" and r.get(keys.SEQ_LEN)]
    if not rows:
        return None
    facet = (keys.DTYPE, keys.HEAD_DIM, keys.CAUSAL, keys.BATCH_HEADS)
    dtype, head_dim, causal, batch_heads = _most_common(rows, *facet)
    rows = [r for r in rows
            if tuple(r.get(f) for f in facet) == (dtype, head_dim, causal, batch_heads)]
    passes = sorted({str(r.get(keys.PASS, "-")) for r in rows})
    # One colour per implementation in every panel, so lines can be followed across passes.
    implementations = sorted({str(r.get(keys.IMPLEMENTATION)) for r in rows})
    palette = plt.get_cmap("tab10")
    colour = {impl: palette(i % 10) for i, impl in enumerate(implementations)}
    panels = 2 if any(r.get(keys.PEAK_MEMORY) for r in rows) else 1  # CPU runs have none
    fig, axes = plt.subplots(panels, len(passes), figsize=(5 * len(passes), 3.5 * panels),
                             squeeze=False)
    for col, pass_name in enumerate(passes):
        lines: dict[str, list[Result]] = defaultdict(list)
        for r in rows:
            if str(r.get(keys.PASS, "-")) == pass_name:
                lines[str(r.get(keys.IMPLEMENTATION))].append(r)
        for impl, points in sorted(lines.items()):
            points = _newest_per_seq_len(points)
            seq = [r.get(keys.SEQ_LEN) for r in points]
            style = _series_style(len(points), impl, colour[impl])
            axes[0, col].plot(seq, [r.mean * 1e3 for r in points], **style)
            memory = [(r.get(keys.SEQ_LEN), r.get(keys.PEAK_MEMORY)) for r in points
                      if r.get(keys.PEAK_MEMORY)]
            if memory and panels == 2:
                axes[1, col].plot(*zip(*[(s, m / 2**20) for s, m in memory], strict=True),
                                  **_series_style(len(memory), impl, colour[impl]))
        axes[0, col].set_title(f"{pass_name}\n{dtype}, d={head_dim}, "
                               f"{'causal, ' if causal else ''}batch x heads {batch_heads}",
                               fontsize=10)
        axes[0, col].set_ylabel("time (ms)")
        axes[-1, col].set_ylabel("peak memory (MiB)" if panels == 2 else "time (ms)")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length (tokens)")
            ax.grid(alpha=0.3, which="both")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    return _save(fig, path)


def model_step_times(results: Sequence[Result], path: Path) -> Path | None:
    """Step time by model size, a bar per precision x eager/compiled, for train steps (else
    the most common mode) at the most common context length."""
    rows = [r for r in results if r.kind == "end_to_end"]
    if not rows:
        return None
    modes = {r.get(keys.MODE) for r in rows}
    mode = "train_step" if "train_step" in modes else _most_common(rows, keys.MODE)
    rows = [r for r in rows if r.get(keys.MODE) == mode]
    context = _most_common(rows, keys.SEQ_LEN)
    rows = [r for r in rows if r.get(keys.SEQ_LEN) == context]
    sizes = sorted({r.get(keys.SIZE) for r in rows}, key=list(MODEL_CONFIGS).index)
    variants = sorted({(r.get(keys.PRECISION), bool(r.get(keys.COMPILED))) for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(sizes)), 4.5))
    width = 0.8 / len(variants)
    for i, (precision, compiled) in enumerate(variants):
        by_size = {r.get(keys.SIZE): r for r in rows
                   if (r.get(keys.PRECISION), bool(r.get(keys.COMPILED))) == (precision, compiled)}
        xs = [j + i * width for j, s in enumerate(sizes) if s in by_size]
        ax.bar(xs, [by_size[s].mean * 1e3 for s in sizes if s in by_size], width,
               yerr=[by_size[s].stddev * 1e3 for s in sizes if s in by_size],
               label=f"{precision}, {'compiled' if compiled else 'eager'}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], sizes)
    ax.set_xlabel("model size")
    ax.set_ylabel(f"{mode} time (ms)")
    ax.set_title(f"{mode} by model size, context {context}, batch 4")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _step_ms(result: Result) -> float:
    """The slowest rank's median step when recorded, else the benchmark round's mean."""
    step = result.get(keys.STEP_S)
    return (step if step is not None else result.mean) * 1e3


def _ddp_label(result: Result) -> str:
    label = f"{result.get(keys.VARIANT)}, {result.get(keys.WORLD_SIZE)} ranks"
    if result.get(keys.BUCKET_SIZE_MB) is not None:
        label += f", {result.get(keys.BUCKET_SIZE_MB)} MB"
    if result.get(keys.OPTIMIZER) not in (None, "adamw"):
        label += f", {result.get(keys.OPTIMIZER)}"
    return label


def ddp_variants(results: Sequence[Result], path: Path) -> Path | None:
    """Step time per DDP variant (bars) and, when present, against bucket size (line)."""
    rows = [r for r in results if r.kind == "ddp"]
    if not rows:
        return None
    # The bucket sweep is one line per world size with the plain optimizer; every other
    # configuration (other variants, sharded optimizers) is a bar of its own.
    def in_sweep(r: Result) -> bool:
        return r.get(keys.BUCKET_SIZE_MB) is not None and r.get(keys.OPTIMIZER) in (None, "adamw")

    swept = sorted(filter(in_sweep, rows),
                   key=lambda r: (r.get(keys.WORLD_SIZE) or 0, r.get(keys.BUCKET_SIZE_MB)))
    fixed = sorted((r for r in rows if not in_sweep(r)),
                   key=lambda r: (r.get(keys.WORLD_SIZE) or 0, str(r.get(keys.VARIANT))),
                   reverse=True)
    fig, axes = plt.subplots(1, 2 if swept else 1, figsize=(12 if swept else 6, 5),
                             squeeze=False)
    ax = axes[0, 0]
    ax.barh([_ddp_label(r) for r in fixed], [_step_ms(r) for r in fixed])
    ax.set_xlabel("train step time (ms), slowest rank")
    ax.set_title("Data-parallel variants")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(alpha=0.3, axis="x")
    if swept:
        ax = axes[0, 1]
        for world, points in groupby(swept, key=lambda r: r.get(keys.WORLD_SIZE)):
            points = list(points)
            ax.plot([r.get(keys.BUCKET_SIZE_MB) for r in points], [_step_ms(r) for r in points],
                    marker="o", label=f"{world} ranks",
                    linestyle="-" if len(points) > 1 else "none")
        _time_axis_from_zero(ax, [_step_ms(r) for r in swept])
        ax.legend(fontsize=8, loc="upper right")
        ax.set_xscale("log")
        ax.set_xlabel("bucket size (MB)")
        ax.set_ylabel("train step time (ms), slowest rank")
        ax.set_title("Bucketed DDP: bucket size sweep")
        ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def allreduce_bandwidth(results: Sequence[Result], path: Path) -> Path | None:
    """Bus bandwidth (algorithm bandwidth if that is all there is) vs message size."""
    rows = [r for r in results if r.kind == "collective"]
    if not rows:
        return None
    metric = keys.BUSBW if any(r.get(keys.BUSBW) for r in rows) else keys.ALGBW
    lines: dict[str, list[Result]] = defaultdict(list)
    for r in rows:
        lines[f"{r.get(keys.BACKEND, '?')}, {r.get(keys.WORLD_SIZE, '?')} ranks"].append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(lines.items()):
        points.sort(key=lambda r: r.get(keys.SIZE_BYTES))
        ax.plot([r.get(keys.SIZE_BYTES) / 1e6 for r in points],
                [keys.gb_per_s(r.get(metric)) for r in points], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel(f"{'bus' if metric == keys.BUSBW else 'algorithm'} bandwidth (GB/s)")
    ax.set_title("All-reduce bandwidth")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)
