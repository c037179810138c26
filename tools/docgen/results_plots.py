"""PNG figures, each of one run (the one with most to draw) and None without enough data:
a lone point is no line, a missing one a gap, and linear time axes start at zero."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from itertools import groupby
from pathlib import Path

from systems.model import MODEL_CONFIGS
from systems.runs import keys
from systems.runs.history import Result
from tools.docgen.claims import ddp_name, newest

_FLOPS, _PEAK_TFLOPS = "flops", "peak_tflops"
# Attention series in the order a reader compares them: ours first, then the rivals.
_ATTENTION_ORDER = ("triton", "triton_gluon_bwd", "triton_gluon_bwd_unordered",
                    "triton_compiled", "sdpa_cudnn", "sdpa_flash", "flex_compiled",
                    "reference")


def _figure(rows: int, cols: int, size: tuple[float, float]):
    """A figure on the Agg canvas (no GUI backend, no pyplot state) and its axes grid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _most_common(results: Sequence[Result], *fields: str) -> object:
    values = Counter(tuple(r.get(f) for f in fields) for r in results).most_common(1)[0][0]
    return values[0] if len(fields) == 1 else values


def _one_run(results: Sequence[Result],
             enough: Callable[[list[Result]], int]) -> list[Result] | None:
    """Of the runs with the most `enough` (0: nothing to draw), the newest's results."""
    by_run: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in results:
        by_run[r.measured_in].append(r)
    return max((rs for rs in by_run.values() if enough(rs) > 0), default=None, key=lambda rs: (
        enough(rs), max(r.datetime for r in rs), rs[0].file))


def _source(results: Sequence[Result]) -> str:
    r = max(results, key=lambda r: r.datetime)
    where = r.file if r.file.endswith(r.run) else f"{r.file}, run {r.short_run}"
    return f"{where}, recorded {r.datetime[:10]}"


def _lines(ax, series: dict[str, dict[float, float]], colours: dict | None = None) -> None:
    xs = sorted({x for points in series.values() for x in points})
    for name, points in series.items():
        ax.plot(xs, [points.get(x, math.nan) for x in xs], marker="o", label=name,
                color=(colours or {}).get(name), linestyle="-" if len(points) > 1 else "none")


def _bars(ax, labels: Sequence[str], values: Sequence[float], values_shown: bool = False,
          **style: object) -> None:
    ax.barh(labels, values, color="tab:blue", **style)
    ax.tick_params(axis="y", labelsize=8)
    for y, value in enumerate(values if values_shown else ()):
        ax.text(value, y, f" {value:.1f}", va="center", fontsize=8)


def _frame(ax, title: str, xlabel: str, ylabel: str = "", log_x: int = 0,
           log_y: bool = False, legend: bool = True, y_from_zero: bool = False) -> None:
    """Labels, title and grid of a panel, its x axis logarithmic to base `log_x` if set."""
    if y_from_zero:
        ax.set_ylim(bottom=0)
    if log_x:
        ax.set_xscale("log", base=log_x)
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if legend:
        ax.legend(fontsize=8)


def size_order(size: object) -> int:
    """A model size's place in `MODEL_CONFIGS` (an unknown one last)."""
    return list(MODEL_CONFIGS).index(size) if size in MODEL_CONFIGS else 99


def _series_points(rows: Sequence[Result]) -> dict[tuple, Result]:
    """(head dim, implementation, sequence length) -> result, of series of three lengths or more."""
    points = newest(rows, lambda r: (r.get(keys.HEAD_DIM), str(r.get(keys.IMPLEMENTATION)),
                                      r.get(keys.SEQ_LEN)))
    lengths = Counter((d, impl) for d, impl, _ in points)
    return {key: r for key, r in points.items() if lengths[key[:2]] >= 3}


def _two_series(rows: list[Result]) -> int:
    """1 where two or more implementations are drawn at one head dim, else 0."""
    series = Counter(d for d, _ in {key[:2] for key in _series_points(rows)})
    return int(any(n >= 2 for n in series.values()))


def _attention_panels(results: Sequence[Result], path: Path, *, time_kind: str,
                      keep: Callable[[Result], bool], value: Callable[[Result], float],
                      ylabel: str, title: str, log_y: bool = False) -> Path | None:
    """A panel per head dim, a line per implementation against sequence length (forward +
    backward cases of `time_kind` that `keep` keeps), of one run."""
    from matplotlib import colormaps

    rows = [r for r in results if r.kind == "attention" and r.time_kind == time_kind and keep(r)
            and str(r.get(keys.PASS, "")).startswith("forward_backward") and r.get(keys.SEQ_LEN)]
    if not rows:
        return None
    facet = (keys.DTYPE, keys.CAUSAL, keys.PASS, keys.BATCH_HEADS)
    common = _most_common(rows, *facet)
    rows = _one_run([r for r in rows if tuple(r.get(f) for f in facet) == common], _two_series)
    if rows is None:
        return None  # no run compares two implementations over sequence length
    points = _series_points(rows)
    head_dims = sorted({d for d, _, _ in points})
    dtype, causal, _, batch_heads = common
    # One colour per implementation in every panel, so a series can be followed across.
    colour = {impl: colormaps["tab10"](i % 10) for i, impl in enumerate(sorted(
        {impl for _, impl, _ in points}, key=lambda n: (
            _ATTENTION_ORDER.index(n) if n in _ATTENTION_ORDER else len(_ATTENTION_ORDER), n)))}
    fig, axes = _figure(1, len(head_dims), (5.5 * len(head_dims), 4.2))
    for ax, head_dim in zip(axes[0], head_dims, strict=True):
        _lines(ax, {impl: by_x for impl in colour if (by_x := {
            n: value(r) for (d, i, n), r in points.items() if d == head_dim and i == impl})},
            colour)
        _frame(ax, f"d = {head_dim}, {dtype}{', causal' if causal else ''}, batch x heads "
               f"{batch_heads}", "sequence length (tokens)", ylabel, log_x=2, log_y=log_y,
               y_from_zero=not log_y)
    fig.suptitle(f"{title}\nfrom {_source(rows)}", fontsize=10)
    return _save(fig, path)


attention_device = partial(
    _attention_panels, time_kind=keys.REPLAY_TIME, keep=lambda r: bool(r.get(_FLOPS)),
    value=lambda r: r.get(_FLOPS) / r.median / 1e12, ylabel="achieved TFLOP/s (FLOPs / median)",
    title="Attention forward + backward, device time (CUDA-graph replay)")
attention_eager = partial(
    _attention_panels, time_kind=keys.EAGER_TIME, value=lambda r: r.median * 1e3,
    keep=lambda r: r.name.startswith("test_attention[") and r.get(keys.BATCH_HEADS) == 1,
    ylabel="median ms (log scale)", log_y=True,
    title="Attention forward + backward at batch 1, eager end-to-end (host included)")


def _recipe_panels(rows: Sequence[Result]) -> dict[str, dict[str, Result]]:
    """"size, ctx N" -> {recipe: result}, for workloads measured with two or more recipes."""
    by_panel: dict[str, dict[str, Result]] = defaultdict(dict)
    for (size, seq_len, recipe), r in newest(
            rows, lambda r: (str(r.get(keys.SIZE)), r.get(keys.SEQ_LEN),
                             str(r.get(keys.RECIPE)))).items():
        by_panel[f"{size}, ctx {seq_len}"][recipe] = r
    return {k: v for k, v in by_panel.items() if len(v) >= 2}


def train_step_recipes(results: Sequence[Result], path: Path) -> Path | None:
    """A panel per workload: each recipe's step beside the floor (model FLOPs at nominal peak)."""
    rows = _one_run([r for r in results if r.kind == "recipe"],
                    lambda rs: len(_recipe_panels(rs)))
    if rows is None:
        return None
    by_panel = _recipe_panels(rows)
    panels = sorted(by_panel, key=lambda k: (size_order(k.split(",")[0]), k))
    cols, grid_rows = min(2, len(panels)), -(-len(panels) // 2)
    fig, axes = _figure(grid_rows, cols, (max(9.0, 6.5 * cols), 2.8 * grid_rows + 0.9))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        recipes = sorted(by_panel[panel].items(), key=lambda kv: -kv[1].median)
        times = [r.median * 1e3 for _, r in recipes]
        _bars(ax, [f"{name}\n({'device' if r.time_kind != keys.EAGER_TIME else 'eager'})"
                   for name, r in recipes], times, values_shown=True)
        floors = {r.get(_FLOPS) / (r.get(_PEAK_TFLOPS) * 1e12) * 1e3 for _, r in recipes
                  if r.get(_FLOPS) and r.get(_PEAK_TFLOPS)}
        if len(floors) == 1:
            (floor,) = floors
            ax.axvline(floor, color="black", linestyle="--",
                       label=f"floor {floor:.1f} ms: model FLOPs at the nominal peak")
        ax.set_xlim(0, max(times) * 1.2)
        _frame(ax, panel, "train step, median ms", legend=len(floors) == 1)
    fig.suptitle("Train step per recipe (forward, loss, backward, AdamW; bf16)\n"
                 f"from {_source(rows)}", fontsize=10)
    return _save(fig, path)


def model_step_times(results: Sequence[Result], path: Path) -> Path | None:
    """A bar per size, precision and compilation: train steps (else the commonest mode)."""
    rows = [r for r in results if r.kind == "end_to_end"]
    if not rows:
        return None
    modes = {r.get(keys.MODE) for r in rows}
    mode = "train_step" if "train_step" in modes else _most_common(rows, keys.MODE)
    rows = [r for r in rows if r.get(keys.MODE) == mode]
    context = _most_common(rows, keys.SEQ_LEN)
    bars = sorted(newest([r for r in rows if r.get(keys.SEQ_LEN) == context], lambda r: (
        r.get(keys.SIZE), str(r.get(keys.PRECISION)), bool(r.get(keys.COMPILED)))).items(),
                  key=lambda kv: (size_order(kv[0][0]), kv[0][1:]))
    fig, axes = _figure(1, 1, (7, 1.2 + 0.35 * len(bars)))
    _bars(axes[0, 0], [f"{size}, {precision}, {'compiled' if compiled else 'eager'}"
                       for (size, precision, compiled), _ in bars],
          [r.mean * 1e3 for _, r in bars], xerr=[r.stddev * 1e3 for _, r in bars])
    _frame(axes[0, 0], f"{mode} by model size, context {context}, batch 4",
           f"{mode} time (ms), mean and standard deviation", legend=False)
    return _save(fig, path)


def ddp_variants(results: Sequence[Result], path: Path) -> Path | None:
    """A bar per DDP variant and a line per world size against bucket size, where swept."""
    rows = [r for r in results if r.kind == "ddp"]
    if not rows:
        return None

    def step_ms(r: Result) -> float:
        return (r.get(keys.STEP_S) or r.mean) * 1e3

    # The bucket sweep is one line per world size with the plain optimizer; every other
    # configuration (other variants, sharded optimizers) is a bar of its own.
    def in_sweep(r: Result) -> bool:
        return r.get(keys.BUCKET_SIZE_MB) is not None and r.get(keys.OPTIMIZER) in (None, "adamw")

    swept = sorted(filter(in_sweep, rows),
                   key=lambda r: (r.get(keys.WORLD_SIZE) or 0, r.get(keys.BUCKET_SIZE_MB)))
    fixed = sorted((r for r in rows if not in_sweep(r)),
                   key=lambda r: (r.get(keys.WORLD_SIZE) or 0, str(r.get(keys.VARIANT))),
                   reverse=True)
    fig, axes = _figure(1, 2 if swept else 1, (12 if swept else 6, 5))
    _bars(axes[0, 0], [ddp_name(r, ranks=True) for r in fixed], [step_ms(r) for r in fixed])
    _frame(axes[0, 0], "Data-parallel variants", "train step time (ms), slowest rank",
           legend=False)
    if swept:
        ax, times = axes[0, 1], [step_ms(r) for r in swept]
        _lines(ax, {f"{world} ranks": {r.get(keys.BUCKET_SIZE_MB): step_ms(r) for r in points}
                    for world, points in groupby(swept, key=lambda r: r.get(keys.WORLD_SIZE))})
        # From zero, so a 2% difference looks like 2%; the spread is written in the corner.
        ax.set_ylim(0, max(times) * 1.1)
        ax.text(0.02, 0.03, f"min {min(times):.1f} ms, max {max(times):.1f} ms "
                f"(+{max(times) / min(times) - 1:.1%})", transform=ax.transAxes, fontsize=8)
        _frame(ax, "Bucketed DDP: bucket size sweep", "bucket size (MB)",
               "train step time (ms), slowest rank", log_x=10)
    return _save(fig, path)


def allreduce_bandwidth(results: Sequence[Result], path: Path) -> Path | None:
    rows = [r for r in results if r.kind == "collective"]
    if not rows:
        return None
    metric = keys.BUSBW if any(r.get(keys.BUSBW) for r in rows) else keys.ALGBW
    lines: dict[str, dict[float, float]] = defaultdict(dict)
    for r in rows:
        lines[f"{r.get(keys.BACKEND, '?')}, {r.get(keys.WORLD_SIZE, '?')} ranks"][
            r.get(keys.SIZE_BYTES) / 1e6] = keys.gb_per_s(r.get(metric))
    fig, axes = _figure(1, 1, (7, 4.5))
    _lines(axes[0, 0], dict(sorted(lines.items())))
    _frame(axes[0, 0], "All-reduce bandwidth", "message size (MB)",
           f"{'bus' if metric == keys.BUSBW else 'algorithm'} bandwidth (GB/s)", log_x=10,
           y_from_zero=True)
    return _save(fig, path)
