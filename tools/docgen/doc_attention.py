"""Generated doc blocks of attention measurements from one saved history: ours against
each rival, medians of one run, with the time kind, the file and its commit.

Ratios are ours / rival: below 1, ours takes less time. A ratio where either case was
host-bound (the gate's rule: the host still enqueueing for most of each wall-timed round)
is marked and left out of the "takes less time" line: such medians time the host, whose
speed moves between the moments two separate cases were timed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from systems.common.formatting import markdown_table
from systems.runs import keys
from systems.runs.gate import HOST_BOUND_SHARE, Timing
from systems.runs.history import Result, load_run, read_run
from tools.docgen.claims import round_ratios, rounds_in_turn

OURS = "triton"
RIVALS = ("sdpa_flash", "sdpa_cudnn", "flex_compiled")
HOST_BOUND_MARK = "†"
LABELS = {"triton": "ours", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN",
          "flex_compiled": "flex (compiled)", "sdpa": "SDPA (own choice)",
          "triton_compiled": "ours, torch.compile",
          "triton_python_path": "ours, Python launch path", "fa4": "FlashAttention-4"}


@dataclass(frozen=True)
class History:
    """One saved run file: its results and where they come from."""

    label: str
    commit: str
    recorded: str
    results: list[Result]
    device: str

    def source(self, time_kind: str, statistic: str) -> str:
        return (f"Time: {time_kind}; {statistic}. From `{self.label}` (commit {self.commit}, "
                f"recorded {self.recorded}).\n")


def read_history(repo: Path, name: str) -> History:
    path = repo / name
    commit_info = read_run(path).get("commit_info") or {}
    commit = str(commit_info.get("id") or "not recorded")[:7]
    if commit_info.get("dirty"):
        commit += ", with uncommitted changes"
    run = load_run(path, repo)
    return History(name, commit, run.datetime[:10] or "date not recorded", run.results,
                   run.device)


def short_dtype(name: object) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(name), str(name))


def _dtype(r: Result) -> str:
    return short_dtype(r.get(keys.DTYPE))


def _workload(r: Result) -> tuple:
    return (r.get(keys.HEAD_DIM), r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN), _dtype(r),
            bool(r.get(keys.CAUSAL)))


def host_bound(r: Result) -> bool:
    """Whether the case's saved rounds time the host (`Timing.host_bound`)."""
    return Timing.from_saved(r.stats, r.info).host_bound


def rival_table(results: Sequence[Result], seconds: Callable[[Result], float | None]) -> str:
    """Per workload: ours and each rival in ms, then ours / rival; a last paragraph lists
    where each ratio is below 1. Implementations other than ours and the rivals are left
    out; a workload without ours is left out. Ratios involving a host-bound case are
    marked and not listed."""
    by_workload: dict[tuple, dict[str, float]] = {}
    bound: set[tuple[tuple, str]] = set()
    for r in results:
        impl, value = str(r.get(keys.IMPLEMENTATION)), seconds(r)
        if impl in (OURS, *RIVALS) and isinstance(value, int | float):
            workload = _workload(r)
            by_workload.setdefault(workload, {})[impl] = value
            if host_bound(r):
                bound.add((workload, impl))
    return _rival_table(by_workload, bound)


def _rival_table(by_workload: dict[tuple, dict[str, float]],
                 host_bound_cases: AbstractSet[tuple[tuple, str]] = frozenset()) -> str:
    """`rival_table` from {workload: {implementation: seconds}} and the (workload,
    implementation) pairs whose cases were host-bound."""
    rivals = [i for i in RIVALS if any(i in times for times in by_workload.values())]
    rows, below, any_marked = [], {rival: [] for rival in rivals}, False
    for workload, times in sorted(by_workload.items()):
        if OURS not in times:
            continue
        d, batch_heads, seq, dtype, causal = workload
        ratios = []
        for rival in rivals:
            ratio = times[OURS] / times[rival] if rival in times else None
            marked = ratio is not None and bool({(workload, OURS), (workload, rival)}
                                                & host_bound_cases)
            any_marked = any_marked or marked
            ratios.append("-" if ratio is None
                          else f"{ratio:.2f} {HOST_BOUND_MARK}" if marked else f"{ratio:.2f}")
            if ratio is not None and ratio < 1 and not marked:
                below[rival].append(f"{batch_heads}x{seq}x{d}")
        rows.append([f"{batch_heads}x{seq}x{d}", dtype, "causal" if causal else "full",
                     *(f"{times[i] * 1e3:.3f}" if i in times else "-" for i in (OURS, *rivals)),
                     *ratios])
    table = markdown_table(["batch·heads x seq x d", "dtype", "mask", "ours ms",
                            *(f"{LABELS[i]} ms" for i in rivals),
                            *(f"ours / {LABELS[i]}" for i in rivals)], rows)
    if not table:
        return ""
    wins = "; ".join(f"{LABELS[rival]}: {', '.join(shapes) or 'none'}"
                     for rival, shapes in below.items())
    text = f"{table}\n\nOurs takes less time than (ours / rival below 1): {wins}."
    if any_marked:
        text += (f"\n\n{HOST_BOUND_MARK} host-bound: ours or the rival spent "
                 f"{HOST_BOUND_SHARE:.0%} or more of each round enqueueing, so the ratio "
                 "compares the host's speed at two moments and is left out of the line "
                 "above.")
    return text + "\n"


def _only(results: Sequence[Result], test: str, keep: Callable[[Result], bool]) -> list[Result]:
    return [r for r in results if r.name.startswith(f"{test}[") and keep(r)]


def _one_time_kind(results: Sequence[Result]) -> str:
    kinds = {r.time_kind for r in results}
    if len(kinds) != 1:
        raise ValueError(f"expected one kind of time, found {sorted(kinds) or 'no results'}")
    return kinds.pop()


def _median(r: Result) -> float:
    return r.median


def _block(history: History, results: Sequence[Result], seconds: Callable[[Result], float | None],
           time_kind: str | None = None) -> str:
    table = rival_table(results, seconds)
    if not table:
        raise ValueError(f"{history.label} holds no such attention cases with ours in them")
    kind = time_kind or _one_time_kind(results)
    return table + "\n" + history.source(kind, "medians in ms")


def attention_eager(repo: Path, history_file: str, batch: str) -> str:
    """Eager forward + backward of `test_attention`, one batch x heads (`1`) or larger
    problems (`large`: more than one matrix, and the leaderboard case's rounds)."""
    history = read_history(repo, history_file)
    if batch == "1":
        cases = _only(history.results, "test_attention",
                      lambda r: r.get(keys.BATCH_HEADS) == 1
                      and r.get(keys.PASS) == "forward_backward")
    elif batch == "large":
        cases = [*_only(history.results, "test_attention",
                        lambda r: (r.get(keys.BATCH_HEADS) or 0) > 1
                        and r.get(keys.PASS) == "forward_backward"),
                 *_only(history.results, "test_attention_leaderboard", lambda r: True)]
    else:
        raise ValueError(f"batch must be 1 or large, not {batch!r}")
    return _block(history, cases, _median)


def attention_eager_interleaved(repo: Path, history_file: str) -> str:
    """Eager forward + backward at batch 1, ours and the SDPA backends timed in turn in one
    run (`extra_info["interleaved_medians_s"]` of our `test_attention` cases)."""
    history = read_history(repo, history_file)
    by_workload: dict[tuple, dict[str, float]] = {}
    rounds: set[object] = set()
    for r in _only(history.results, "test_attention",
                   lambda r: isinstance(r.get(keys.INTERLEAVED_MEDIANS_S), dict)):
        by_workload[_workload(r)] = {str(impl): float(seconds) for impl, seconds
                                     in r.get(keys.INTERLEAVED_MEDIANS_S).items()}
        rounds.add(r.get(keys.INTERLEAVED_ROUNDS))
    table = _rival_table(by_workload)
    if not table:
        raise ValueError(f"{history.label} holds no interleaved attention rounds")
    each = " or ".join(str(n) for n in sorted(rounds, key=str))
    return table + "\n" + history.source(
        "eager end-to-end (host included)",
        f"medians in ms of {each} rounds per implementation, taken in turn in one run")


def _has_do_bench(r: Result) -> bool:
    return isinstance(r.get(keys.DO_BENCH_MEDIAN_MS), int | float)


def _do_bench_cases(results: Sequence[Result]) -> list[Result]:
    """Forward + backward cases that recorded do_bench's median: the leaderboard case and
    `test_attention`'s problems of many matrices."""
    return [*_only(results, "test_attention",
                   lambda r: _has_do_bench(r) and r.get(keys.PASS) == "forward_backward"),
            *_only(results, "test_attention_leaderboard", _has_do_bench)]


def _do_bench_seconds(r: Result) -> float:
    """A case's do_bench median (saved in ms), in seconds."""
    return r.get(keys.DO_BENCH_MEDIAN_MS) / 1e3  # type: ignore[operator]


def attention_device_time(repo: Path, history_file: str) -> str:
    """Device time: `test_attention_device_time` (CUDA-graph replay) and the do_bench
    medians of the cases that record one (`_do_bench_cases`), one table each."""
    history = read_history(repo, history_file)
    replay = _only(history.results, "test_attention_device_time", lambda r: True)
    do_bench = _do_bench_cases(history.results)
    parts = []
    if replay:
        parts.append(_block(history, replay, _median))
    if do_bench:
        parts.append(_block(history, do_bench, _do_bench_seconds, keys.DO_BENCH_TIME))
    if not parts:
        raise ValueError(f"{history.label} holds no device-time attention cases")
    return "\n".join(parts)


# Ours with each backward, timed against the same rival: the default two passes and the
# fused Gluon backward for Hopper, ordered (deterministic) and not.
BACKWARD_VARIANTS = ("triton", "triton_gluon_bwd", "triton_gluon_bwd_unordered")
VARIANT_RIVAL = "sdpa_cudnn"
VARIANT_LABELS = {"triton": "ours (default)", "triton_gluon_bwd": "ours + Gluon ordered",
                  "triton_gluon_bwd_unordered": "ours + Gluon unordered",
                  "sdpa_cudnn": "SDPA cuDNN"}


def attention_backward_variants(repo: Path, *history_files: str) -> str:
    """Forward + backward of ours with each backward (`BACKWARD_VARIANTS`) and SDPA cuDNN,
    per workload and kind of time: eager end-to-end medians (`test_attention`, the
    leaderboard case), do_bench medians (`_do_bench_cases`), and CUDA-graph replay
    medians (`test_attention_device_time`); each variant over cuDNN, where a backward
    other than the default was timed. From several runs of
    the same cases (one file each), a time is the median over the runs, and a ratio the
    median of each run's own ratio, with its lowest and highest."""
    if not history_files:
        raise ValueError("attention-backward-variants needs at least one history file")
    histories = [read_history(repo, name) for name in history_files]
    impls = (*BACKWARD_VARIANTS, VARIANT_RIVAL)
    # (kind, workload) -> implementation -> its time in each run, and its ratio to cuDNN's
    times: dict[tuple[str, tuple], dict[str, list[float]]] = {}
    ratios: dict[tuple[str, tuple], dict[str, list[float]]] = {}
    for history in histories:
        for kind, results, seconds in _variant_kinds(history.results):
            in_run: dict[tuple, dict[str, float]] = {}
            for r in results:
                if (impl := str(r.get(keys.IMPLEMENTATION))) in impls:
                    in_run.setdefault(_workload(r), {})[impl] = seconds(r)
            for workload, found in in_run.items():
                rival = found.get(VARIANT_RIVAL)
                for impl, t in found.items():
                    times.setdefault((kind, workload), {}).setdefault(impl, []).append(t)
                    if impl != VARIANT_RIVAL and rival:
                        ratios.setdefault((kind, workload), {}).setdefault(impl, []).append(
                            t / rival)
    kinds = [kind for kind, _, _ in _variant_kinds([])]
    rows = []
    for kind, workload in sorted(times, key=lambda key: (kinds.index(key[0]), key[1])):
        d, batch_heads, seq, dtype, causal = workload
        timed, ratio = times[kind, workload], ratios.get((kind, workload), {})
        if not set(timed) & set(BACKWARD_VARIANTS[1:]):
            continue  # only the default backward here: the rival tables have it
        rows.append([f"{batch_heads}x{seq}x{d}", dtype, "causal" if causal else "full", kind,
                     *(f"{statistics.median(timed[i]) * 1e3:.3f}" if i in timed else "-"
                       for i in impls),
                     *(ratio_spread(ratio[i]) if i in ratio else "-"
                       for i in BACKWARD_VARIANTS)])
    if not rows:
        raise ValueError(f"{', '.join(history_files)} hold no forward + backward of "
                         f"{', '.join(BACKWARD_VARIANTS[1:])}")
    table = markdown_table(
        ["batch·heads x seq x d", "dtype", "mask", "time", *(f"{VARIANT_LABELS[i]} ms"
                                                             for i in impls),
         *(f"{VARIANT_LABELS[i]} / cuDNN" for i in BACKWARD_VARIANTS)], rows)
    time_kind = ("eager: end-to-end medians (host included); do_bench: device-time medians "
                 "(triton.testing.do_bench); graph replay: medians of a CUDA graph's replays")
    if len(histories) == 1:
        return table + "\n" + histories[0].source(time_kind, "forward + backward, in ms")
    sources = "; ".join(f"`{h.label}` (commit {h.commit}, recorded {h.recorded})"
                        for h in histories)
    return (f"{table}\nTime: {time_kind}; forward + backward, in ms, the median of "
            f"{len(histories)} runs; a ratio is the median of the runs' own (lowest to "
            f"highest). From {sources}.\n")


IN_TURN_RIVALS = ("sdpa_cudnn", "sdpa_flash")
OPTIONAL_IN_TURN_RIVALS = ("fa4",)
IN_TURN_STEPS = {"test_attention": "forward + backward",
                 "test_attention_table": "forward + backward",
                 "test_attention_leaderboard": "leaderboard: o.sum(), backward"}


def attention_device_in_turn(repo: Path, history_file: str, test: str | None = None) -> str:
    """Device time of ours (each implementation with the record) and the SDPA backends in
    do_bench rounds taken in turn (`extra_info["interleaved_device_ms"]`), of one test or of
    every test that records such rounds: per case the
    medians over the rounds and, for each rival, the median of the per-round ratios with
    their lowest and highest. A round's ratio compares two times taken moments apart, so it
    does not carry the GPU's drift between cases timed minutes apart."""
    history = read_history(repo, history_file)
    steps = IN_TURN_STEPS if test is None else {test: IN_TURN_STEPS[test]}
    cases = [(step, r) for name, step in steps.items()
             for r in _only(history.results, name, lambda r: rounds_in_turn(r) is not None)]
    # FlashAttention-4 has a column where some case timed it (it runs where it is installed).
    rivals = [*IN_TURN_RIVALS, *(rival for rival in OPTIONAL_IN_TURN_RIVALS
                                 if any(rival in rounds_in_turn(r) for _, r in cases))]
    rows, at_or_below, counts = [], {rival: [] for rival in rivals}, set()
    for step, r in cases:
        impl, rounds = str(r.get(keys.IMPLEMENTATION)), rounds_in_turn(r)
        counts.add(len(rounds[impl]))
        d, batch_heads, seq, dtype, _ = _workload(r)
        shape = f"{batch_heads}x{seq}x{d}"
        ratios = []
        for rival in rivals:
            if rival not in rounds:
                ratios.append("-")
                continue
            per_round = round_ratios(rounds, impl, rival)
            ratios.append(_median_and_range(per_round))
            if statistics.median(per_round) <= 1:
                at_or_below[rival].append(f"{VARIANT_LABELS.get(impl, impl)} at {shape}")
        rows.append([shape, dtype, step, VARIANT_LABELS.get(impl, impl),
                     *(f"{statistics.median(rounds[i]):.3f}" if i in rounds else "-"
                       for i in (impl, *rivals)), *ratios])
    if not rows:
        raise ValueError(f"{history.label} holds no device-time rounds taken in turn")
    table = markdown_table(["batch·heads x seq x d", "dtype", "step", "ours", "ours ms",
                            *(f"{LABELS[i]} ms" for i in rivals),
                            *(f"ours / {LABELS[i]}" for i in rivals)], rows)
    lines = "; ".join(f"{LABELS[rival]}: {', '.join(cases) or 'none'}"
                      for rival, cases in at_or_below.items())
    each = " or ".join(str(n) for n in sorted(counts))
    return (f"{table}\n\nAt or below the rival (median of the per-round ratios at most 1): "
            f"{lines}.\n\n" + history.source(
                keys.DO_BENCH_TIME, f"medians in ms over {each} rounds taken in turn in one "
                "run (one do_bench per implementation per round); a ratio is the median of "
                "the rounds' own ratios (lowest to highest)"))


def _median_and_range(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def _variant_kinds(results: Sequence[Result]
                   ) -> list[tuple[str, list[Result], Callable[[Result], float | None]]]:
    """(kind of time, the cases timed that way, a case's seconds) of the variants table."""
    return [
        ("eager", [*_only(results, "test_attention",
                          lambda r: r.get(keys.PASS) == "forward_backward"),
                   *_only(results, "test_attention_leaderboard", lambda r: True)], _median),
        ("do_bench", _do_bench_cases(results), _do_bench_seconds),
        ("graph replay", _only(results, "test_attention_device_time", lambda r: True),
         _median),
    ]


def ratio_spread(values: list[float]) -> str:
    """The median ratio; from several runs, with its lowest to highest."""
    median = f"{statistics.median(values):.2f}"
    return median if len(values) == 1 else f"{median} ({min(values):.2f}–{max(values):.2f})"
