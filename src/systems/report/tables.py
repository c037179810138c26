"""Markdown tables of benchmark results: end-to-end steps, speedups, attention, distributed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from systems.accounting import step_memory
from systems.common.formatting import fmt, markdown_table
from systems.model import MODEL_CONFIGS, ModelConfig
from systems.runs import keys
from systems.runs.history import Result

_SIZE_ORDER = {name: i for i, name in enumerate(MODEL_CONFIGS)}


def provenance(results: Sequence[Result], by: str | None = None) -> str:
    """What a table's times measure and which history files (and runs) they come from;
    where the kinds differ, `by` (an extra_info key) names the rows of each kind."""
    kinds: dict[str, set[str]] = {}
    for r in results:
        kinds.setdefault(r.time_kind, set()).add(str(r.get(by)) if by else "")
    times = "; ".join(f"{', '.join(sorted(names))}: {kind}" if by and len(kinds) > 1 else kind
                      for kind, names in sorted(kinds.items()))
    sources = sorted({r.file if r.run == Path(r.file).name else f"{r.file} (measured in {r.run})"
                      for r in results})
    return (f"Time: {times}. From: {', '.join(f'`{s}`' for s in sources)}.\n"
            if results else "")


def mean_std_ms(result: Result, digits: int = 2) -> str:
    return f"{result.mean * 1e3:.{digits}f} ± {result.stddev * 1e3:.{digits}f}"


def median_ms(result: Result, digits: int = 2) -> str:
    """The statistic every ratio in the report is formed from."""
    return f"{result.median * 1e3:.{digits}f}"


def _sort_key(*fields: str) -> Callable[[Result], tuple]:
    def key(result: Result) -> tuple:
        values = [result.get(f) for f in fields]
        return tuple((_SIZE_ORDER.get(v, len(_SIZE_ORDER)), "") if f == keys.SIZE
                     else (0, str(v)) if isinstance(v, str) else (v is None, v or 0)
                     for f, v in zip(fields, values, strict=True))
    return key


def _gib(value: object) -> str:
    return fmt(value, ".2f", 2**-30)


def _compile_tag(result: Result) -> str:
    return "compiled" if result.get(keys.COMPILED) else "eager"


def end_to_end_table(results: Sequence[Result]) -> str:
    """One row per end-to-end step benchmark: time, throughput, memory and the run file."""
    rows = sorted((r for r in results if r.kind == "end_to_end"),
                  key=_sort_key(keys.SIZE, keys.SEQ_LEN, keys.MODE, keys.PRECISION,
                                keys.COMPILED, keys.ATTENTION))
    return markdown_table(
        ["size", "ctx", "mode", "precision", "compile", "attention", "mean ± std ms",
         "TFLOP/s", "MFU", "tokens/s", "peak GiB", "run"],
        [[r.get(keys.SIZE), r.get(keys.SEQ_LEN), r.get(keys.MODE), r.get(keys.PRECISION),
          _compile_tag(r), r.get(keys.ATTENTION, "-"), mean_std_ms(r),
          fmt(r.get(keys.TFLOPS), ".1f"), fmt(r.get(keys.MFU), ".1%"),
          fmt(r.get(keys.TOKENS_PER_S), ",.0f"), _gib(r.get(keys.PEAK_MEMORY)), r.short_run]
         for r in rows])


def speedup_table(
    results: Sequence[Result], axis: str, baseline: object, contender: object,
    label: Sequence[str], names: tuple[str, str] | None = None,
) -> str:
    """Pair results equal in everything but `axis` and measured in the same run (never a
    ratio across runs or files); speedup = base / contender, of medians.

    `label`: extra_info keys shown to identify each pair; `names`: the two sides' column
    names (default: the axis values).
    """
    base_name, contender_name = names or (str(baseline), str(contender))
    def identity(r: Result) -> tuple:
        return r.kind, r.measured_in, tuple(sorted((k, str(v)) for k, v in r.info.items()
                                                   if k in _IDENTITY_KEYS and k != axis))

    base = {identity(r): r for r in results if r.get(axis) == baseline}
    rows = []
    for r in results:
        if r.get(axis) != contender or identity(r) not in base:
            continue
        b = base[identity(r)]
        rows.append([*(r.get(k, "-") for k in label), median_ms(b), median_ms(r),
                     f"{b.median / r.median:.2f}x", _gib(b.get(keys.PEAK_MEMORY)),
                     _gib(r.get(keys.PEAK_MEMORY)), r.short_run])
    rows.sort(key=lambda row: tuple((_SIZE_ORDER.get(v, 99), str(v)) for v in row[:len(label)]))
    return markdown_table([*(keys.HEADERS.get(k, k) for k in label), f"{base_name} median ms",
                           f"{contender_name} median ms", "speedup", f"{base_name} peak GiB",
                           f"{contender_name} peak GiB", "run"], rows)


def recipes_table(results: Sequence[Result], baseline: str = "pytorch_baseline",
                  contender: str = "optimized", plain: str = "eager") -> str:
    """Per model size and context: the three training recipes side by side, the speedups of
    `contender` over `baseline` and over `plain` (ratios of medians), and cold starts (first
    step, compiling)."""
    by_workload: dict[tuple, dict[str, Result]] = {}
    for r in results:  # recipes are put side by side only when measured in one run
        if r.kind == "recipe":
            by_workload.setdefault((r.get(keys.SIZE), r.get(keys.SEQ_LEN), r.measured_in), {})[
                str(r.get(keys.RECIPE))] = r
    rows = []
    for (size, context, _), recipes in sorted(
            by_workload.items(), key=lambda item: (_SIZE_ORDER.get(item[0][0], 99), str(item[0]))):
        ours = recipes.get(contender)
        if ours is None:
            continue
        base, eager = recipes.get(baseline), recipes.get(plain)
        rows.append([
            size, context, *(median_ms(r) if r else "-" for r in (eager, base, ours)),
            *(f"{r.median / ours.median:.2f}x" if r else "-" for r in (base, eager)),
            fmt(ours.get(keys.MFU), ".1%"),
            *(fmt(r.get(keys.COLD_START_S), ".1f") if r else "-" for r in (base, ours)),
            _gib(ours.get(keys.PEAK_MEMORY)), ours.short_run])
    return markdown_table(
        ["size", "ctx", f"{plain} median ms", f"{baseline} median ms", f"{contender} median ms",
         f"vs {baseline}", f"vs {plain}", f"{contender} MFU", f"{baseline} cold s",
         f"{contender} cold s", f"{contender} peak GiB", "run"], rows)


# What makes two results the same workload (the measured numbers are left out).
_IDENTITY_KEYS = {
    keys.SIZE, keys.SEQ_LEN, keys.BATCH, keys.MODE, keys.PRECISION, keys.COMPILED,
    keys.ATTENTION, keys.IMPLEMENTATION, keys.SEQ_LEN, keys.HEAD_DIM, keys.DTYPE, keys.PASS,
    keys.VARIANT, keys.BUCKET_SIZE_MB, keys.WORLD_SIZE, keys.BACKEND, keys.SIZE_BYTES,
    keys.CAUSAL, keys.BATCH_HEADS, "d_model", "d_ff", "num_layers", "num_heads", "vocab_size",
}


def warmup_study_table(results: Sequence[Result]) -> str:
    """The same step timed after 0, 1, 2, ... untimed warm-up steps."""
    rows = sorted((r for r in results if r.kind == "warmup_study"),
                  key=_sort_key(keys.SIZE, keys.PRECISION, keys.WARMUP_ROUNDS))
    return markdown_table(
        ["size", "ctx", "mode", "precision", "warm-up steps", "mean ± std ms", "max ms", "run"],
        [[r.get(keys.SIZE), r.get(keys.SEQ_LEN), r.get(keys.MODE), r.get(keys.PRECISION),
          r.get(keys.WARMUP_ROUNDS), mean_std_ms(r), fmt(r.stats.get("max"), ".2f", 1e3),
          r.short_run] for r in rows])


def attention_table(results: Sequence[Result]) -> str:
    rows = sorted((r for r in results if r.kind == "attention"),
                  key=_sort_key(keys.PASS, keys.DTYPE, keys.CAUSAL, keys.BATCH_HEADS,
                                keys.HEAD_DIM, keys.SEQ_LEN, keys.IMPLEMENTATION))
    return markdown_table(
        ["implementation", "mode", "dtype", "causal", "batch x heads", "seq len", "head dim",
         "mean ± std ms", "TFLOP/s", "peak GiB", "run"],
        [[r.get(keys.IMPLEMENTATION), r.get(keys.PASS, "-"), r.get(keys.DTYPE, "-"),
          r.get(keys.CAUSAL, "-"), r.get(keys.BATCH_HEADS, "-"), r.get(keys.SEQ_LEN),
          r.get(keys.HEAD_DIM, "-"), mean_std_ms(r, 3),
          fmt(r.get(keys.TFLOPS), ".1f"), _gib(r.get(keys.PEAK_MEMORY)), r.short_run]
         for r in rows])


_SAME_TRAINING = (keys.SIZE, keys.BATCH_PER_RANK, keys.SEQ_LEN, keys.WORLD_SIZE, keys.BACKEND)


def overhead_vs_no_comm(result: Result, results: Sequence[Result]) -> float | None:
    """The step's time over that of each rank training alone (variant "none") on the same
    model, batch and world size, measured in the same run, minus 1; the value a run saved
    itself where it has no such case."""
    alone = [r for r in results if r.get(keys.VARIANT) == "none"
             and r.measured_in == result.measured_in
             and all(r.get(k) == result.get(k) for k in _SAME_TRAINING)]
    step = result.get(keys.STEP_S)
    if alone and isinstance(step, int | float) and alone[0].get(keys.STEP_S):
        return step / alone[0].get(keys.STEP_S) - 1
    return result.get(keys.OVERHEAD_VS_NO_COMM)


def ddp_table(results: Sequence[Result]) -> str:
    rows = sorted((r for r in results if r.kind == "ddp"),
                  key=_sort_key(keys.WORLD_SIZE, keys.VARIANT, keys.BUCKET_SIZE_MB, keys.OPTIMIZER))
    return markdown_table(
        ["variant", "optimizer", "world size", "bucket MB", "step ms (slowest rank, median)",
         "vs no communication", "waiting after backward", "peak GiB", "run"],
        [[r.get(keys.VARIANT), r.get(keys.OPTIMIZER, "-"), r.get(keys.WORLD_SIZE, "-"),
          r.get(keys.BUCKET_SIZE_MB, "-"), fmt(r.get(keys.STEP_S), ".1f", 1e3),
          fmt(overhead_vs_no_comm(r, results), "+.1%"),
          fmt(r.get(keys.SYNC_WAIT_FRACTION), ".1%"), fmt(r.get(keys.PEAK_MEMORY), ".2f", 2**-30),
          r.short_run] for r in rows])


def collective_table(results: Sequence[Result]) -> str:
    rows = sorted((r for r in results if r.kind == "collective"),
                  key=_sort_key(keys.BACKEND, keys.WORLD_SIZE, keys.SIZE_BYTES))
    return markdown_table(
        ["backend", "world size", "size MB", "ms per all-reduce (slowest rank, median)",
         "algbw GB/s", "busbw GB/s", "run"],
        [[r.get(keys.BACKEND, "-"), r.get(keys.WORLD_SIZE, "-"),
          fmt(r.get(keys.SIZE_BYTES), ".3g", 1e-6), fmt(r.get(keys.ALLREDUCE_S), ".3f", 1e3),
          fmt(keys.gb_per_s(r.get(keys.ALGBW)), ".1f"),
          fmt(keys.gb_per_s(r.get(keys.BUSBW)), ".1f"), r.short_run] for r in rows])


_CONFIG_FIELDS = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")


def model_config(result: Result) -> ModelConfig | None:
    """The measured model's hyperparameters (as recorded), else its preset, else None."""
    if all(isinstance(result.get(f), int) for f in _CONFIG_FIELDS):
        return ModelConfig(**{f: result.get(f) for f in _CONFIG_FIELDS},
                           max_seq_len=max(2048, int(result.get(keys.SEQ_LEN) or 0)))
    return MODEL_CONFIGS.get(str(result.get(keys.SIZE)))


def memory_prediction_table(results: Sequence[Result]) -> str:
    """Measured peak memory of end-to-end steps next to `systems.accounting.step_memory`."""
    rows = []
    for r in sorted((r for r in results if r.kind == "end_to_end"),
                    key=_sort_key(keys.SIZE, keys.SEQ_LEN, keys.MODE, keys.PRECISION)):
        config, measured = model_config(r), r.get(keys.PEAK_MEMORY)
        if config is None or not measured or r.get(keys.COMPILED) \
                or r.get(keys.ATTENTION, "reference") != "reference":
            continue  # the model describes eager steps with reference attention only
        predicted = step_memory(config, r.get(keys.BATCH, 4), r.get(keys.SEQ_LEN),
                                r.get(keys.PRECISION), r.get(keys.MODE))
        rows.append([r.get(keys.SIZE), r.get(keys.SEQ_LEN), r.get(keys.MODE),
                     r.get(keys.PRECISION), _gib(predicted.activations),
                     _gib(predicted.peak), _gib(measured), f"{measured / predicted.peak:.2f}"])
    return markdown_table(["size", "ctx", "mode", "precision", "predicted activations GiB",
                           "predicted peak GiB (lower bound)", "measured peak GiB",
                           "measured / predicted"], rows)
