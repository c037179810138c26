"""Generated doc blocks quoted from the backward experiments, each pass timed alone beside
our two-pass backward and cuDNN's: `studies/attention_dq_reduce/study.py` (a fused Triton
backward whose dQ is summed by TMA bulk reductions) and `studies/attention_gluon_backward/study.py`
(the backward of 5 matmuls in Gluon with FA3's schedule, and its ablations); the forward
in Gluon beside ours and cuDNN's (`studies/attention_gluon_forward/study.py`); the
forward + backward kernel by kernel (`studies/attention_kernel_breakdown/study.py`); and the
kernels' tile order in sections of matrices (`studies/attention_tile_order/study.py`)."""

from __future__ import annotations

import statistics
from pathlib import Path

from systems.accounting import attention_flops
from systems.common.formatting import markdown_table
from systems.profiling.step_breakdown import DEFAULT_MATMUL_TFLOPS
from tools.docgen.doc_attention import VARIANT_LABELS, VARIANT_RIVAL, ratio_spread
from tools.docgen.doc_blocks import read_source

# Tile matmuls per (query tile, key tile) pair: ours recomputes S and dP in its dQ pass.
TWO_PASS_MATMULS, FUSED_MATMULS = 7, 5


def _experiment(repo: Path, name: str) -> dict:
    data = read_source(repo, name, "backward experiment")
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{name}: not a backward experiment (no rows)")
    return data


def _shape(row: dict) -> str:
    return f"{row['batch']}x{row['seq']}x{row['head_dim']}"


def _ms(row: dict, field: str) -> str:
    return f"{row[field]:.3f}" if field in row else "-"


def _ratio(numerator: dict, denominator: dict) -> str:
    if "backward_ms" not in numerator or "backward_ms" not in denominator:
        return "-"
    return f"{numerator['backward_ms'] / denominator['backward_ms']:.2f}"


def _fastest(rows: list[dict]) -> dict:
    """The row of least backward time among those timed, or {}."""
    return min((r for r in rows if "backward_ms" in r), key=lambda r: r["backward_ms"],
               default={})


def _tflops(flops: float, ms: float) -> float:
    return flops / ms / 1e9


def _summary_table(ours_rows: list[dict], fused_rows: list[dict], cudnn: dict[str, dict]
                   ) -> str:
    rows = []
    for ours in ours_rows:
        shape = _shape(ours)
        best = _fastest([r for r in fused_rows if _shape(r) == shape])
        rival = cudnn.get(shape, {})
        rows.append([
            shape, _ms(ours, "forward_ms"), _ms(rival, "forward_ms"), _ms(ours, "backward_ms"),
            _ms(best, "backward_ms"), str(tuple(best["config"])) if best else "-",
            _ms(rival, "backward_ms"), _ratio(ours, rival), _ratio(best, ours)])
    return markdown_table(["b x seq x d", "ours forward ms", "cuDNN forward ms",
                           "ours backward (two passes) ms", "dQ by TMA reductions ms",
                           "its tiles (m, n, warps, stages)", "cuDNN backward ms",
                           "two passes / cuDNN", "TMA reductions / two passes"], rows)


def _configs_table(fused_rows: list[dict]) -> str:
    rows = [[_shape(r), str(tuple(r["config"])),
             f"failed: {r['error']}" if "error" in r else _ms(r, "backward_ms"),
             f"{r['dq_run_to_run']:.1e}" if "dq_run_to_run" in r else "-"]
            for r in fused_rows]
    return markdown_table(["b x seq x d", "tiles (m, n, warps, stages)", "backward ms",
                           "dQ max diff, two runs"], rows)


def _rates_table(ours_rows: list[dict], cudnn: dict[str, dict]) -> str:
    """The matmul rate of cuDNN's backward and of our two passes, and the rate our 7
    matmuls would need to take cuDNN's time, against the bf16 matmul ceiling."""
    rows = []
    for ours in ours_rows:
        rival = cudnn.get(_shape(ours), {})
        if "backward_ms" not in rival:
            continue
        # The usual count: a backward is 2.5 forwards' matmuls, i.e. 5 tile matmuls.
        useful = attention_flops(ours["batch"], ours["seq"], ours["seq"], ours["head_dim"],
                                 ours.get("causal", True), "backward")
        ours_flops = useful / FUSED_MATMULS * TWO_PASS_MATMULS
        needed = _tflops(ours_flops, rival["backward_ms"])
        rows.append([_shape(ours), f"{_tflops(useful, rival['backward_ms']):.0f}",
                     f"{_tflops(ours_flops, ours['backward_ms']):.0f}", f"{needed:.0f}",
                     f"{needed / DEFAULT_MATMUL_TFLOPS:.0%}"])
    return markdown_table(["b x seq x d", f"cuDNN backward TFLOP/s ({FUSED_MATMULS} matmuls)",
                           f"ours, two passes, TFLOP/s run ({TWO_PASS_MATMULS} matmuls)",
                           f"TFLOP/s {TWO_PASS_MATMULS} matmuls need for cuDNN's time",
                           f"that of {DEFAULT_MATMUL_TFLOPS:.0f} TFLOP/s (bf16 matmul "
                           "ceiling)"], rows)


def backward_passes(repo: Path, file: str) -> str:
    """Per shape: the forwards and backwards of ours and cuDNN, the fused variant's best
    tiles, and ratios; every fused tile config with how far two of its runs' dQ differ
    (its reduction order is not fixed); and the matmul rates (`_rates_table`)."""
    data = _experiment(repo, file)
    of_kind = {kind: [r for r in data["rows"] if r.get("kind") == kind]
               for kind in ("two_pass", "fused_tma_reduce", "cudnn")}
    cudnn = {_shape(r): r for r in of_kind["cudnn"]}
    tables = [_summary_table(of_kind["two_pass"], of_kind["fused_tma_reduce"], cudnn),
              _configs_table(of_kind["fused_tma_reduce"]),
              _rates_table(of_kind["two_pass"], cudnn)]
    timed = of_kind["two_pass"] or data["rows"]
    dtypes = ", ".join(sorted({str(r.get("dtype")) for r in timed}))
    masks = ", ".join(sorted({"causal" if r.get("causal", True) else "full" for r in timed}))
    return ("\n\n".join(t for t in tables if t)
            + "\n\nTime: device time (`triton.testing.do_bench` medians), each pass alone, "
            f"{dtypes}, {masks}; FLOP rates are matmul FLOPs run over those times, a tile matmul "
            "being a fifth of the usual backward count (cuDNN's counted at FA2's 5). "
            f"From `{file}` ({data.get('device')}, torch {data.get('torch')}, "
            f"Triton {data.get('triton')}; kernels of commit {data.get('commit')}).\n")


def _gluon_config(row: dict) -> str:
    """What a Gluon config changes, in words: MMA mode, how dQ is added, program order."""
    config = row["config"]
    # The library's kernel (configs with "ordered") runs key blocks fastest. The study's
    # own kernels named a dQ mode; those saved before a field existed ran the other order:
    # matrices fastest, and key blocks last to first (the shortest programs first).
    library = "ordered" in config
    # Runs before the schedule field said longest_first (True or False).
    schedule = config.get("schedule") or (
        "longest_first" if config.get("longest_first", False) else "shortest_first")
    order = ("keys" if config.get("keys_fastest", library) else "matrices") + " fastest, " + (
        schedule.replace("_", " "))
    mma = "async" if config.get("async_mma") else "sync"
    writers = config.get("writers", 1)
    mode = ("ordered" if config["ordered"] else "any order") if library else config.get(
        "dq_mode")
    # Every run before tiles of 128 query rows existed used 64.
    block_m = config.get("block_m", 64)
    return (f"{mma}, dQ {mode}, {order}"
            + (f", {writers} writers" if writers != 1 else "")
            + (f", {block_m}-row query tiles" if block_m != 64 else ""))


# The study's Gluon dQ modes that added in a fixed order (the library's kernel says
# "ordered"); a run's two dQs must also agree.
DETERMINISTIC_DQ_MODES = ("tma_ordered",)


def _deterministic(row: dict) -> bool:
    config = row["config"]
    return ((config.get("ordered") or config.get("dq_mode") in DETERMINISTIC_DQ_MODES)
            and row.get("dq_run_to_run") == 0.0)


def _total_ratio(forward: dict, backward: dict, rival: dict) -> str:
    """(our forward + a backward) over cuDNN's forward + backward."""
    if "forward_ms" not in forward or "backward_ms" not in backward or not {
            "forward_ms", "backward_ms"} <= rival.keys():
        return "-"
    ours = forward["forward_ms"] + backward["backward_ms"]
    return f"{ours / (rival['forward_ms'] + rival['backward_ms']):.2f}"


def _gluon_dq_column(row: dict) -> str:
    if row.get("ablation"):  # dQ left out, all or part
        return "ablation: not checked"
    return f"{row['dq_run_to_run']:.1e}" if "dq_run_to_run" in row else "-"


def _preparation(rows: list[dict]) -> str:
    """How a run computed D, the zeroing and the cast: its summary rows time the two
    Triton kernels that do it; runs without that field used PyTorch ops."""
    timed = [r for r in rows if r.get("kind") == "summary" and "prepare_finish_ms" in r]
    if not timed:
        return "by PyTorch ops"
    each = ", ".join(f"{_shape(r)}: {r['prepare_finish_ms']:.3f} ms" for r in timed)
    return f"by one Triton kernel before and one after, together {each}"


def gluon_backward(repo: Path, file: str) -> str:
    """Per shape: our two passes (and each pass alone), cuDNN's backward and the fastest
    complete Gluon backward, with ratios; then every Gluon config, ablations included
    ("discard": dQ computed, not added; "skip": dK and dV alone)."""
    data = _experiment(repo, file)
    of_kind = {kind: [r for r in data["rows"] if r.get("kind") == kind]
               for kind in ("two_pass", "gluon", "cudnn")}
    cudnn = {_shape(r): r for r in of_kind["cudnn"]}
    summary, totals, configs = [], [], []
    for ours in of_kind["two_pass"]:
        shape = _shape(ours)
        rival = cudnn.get(shape, {})
        gluon = [r for r in of_kind["gluon"] if _shape(r) == shape]
        complete = [r for r in gluon if "backward_ms" in r and not r.get("ablation")]
        best = _fastest(complete)
        best_fixed = _fastest([r for r in complete if _deterministic(r)])
        summary.append([shape, _ms(ours, "dq_pass_ms"), _ms(ours, "dkdv_pass_ms"),
                        _ms(ours, "backward_ms"), _ms(rival, "backward_ms"),
                        _ms(best, "backward_ms"), _gluon_config(best) if best else "-",
                        _ratio(best, ours), _ratio(best, rival), _ratio(ours, rival),
                        _ms(best_fixed, "backward_ms"), _ratio(best_fixed, rival)])
        if "forward_ms" in ours and "forward_ms" in rival:
            totals.append([shape, _ms(ours, "forward_ms"), _ms(rival, "forward_ms"),
                           _total_ratio(ours, ours, rival), _total_ratio(ours, best, rival),
                           _total_ratio(ours, best_fixed, rival)])
        configs += [[shape, _gluon_config(r),
                     f"failed: {r['error']}" if "error" in r else _ms(r, "backward_ms"),
                     _ratio(r, ours), _ratio(r, rival), _gluon_dq_column(r)] for r in gluon]
        if "dq_run_to_run" in rival:  # runs that asked whether cuDNN's dQ is fixed too
            configs.append([shape, "cuDNN (SDPA)", _ms(rival, "backward_ms"),
                            _ratio(rival, ours), _ratio(rival, rival), _gluon_dq_column(rival)])
    tables = [markdown_table(["b x seq x d", "ours dQ pass ms", "ours dK/dV pass ms",
                              "ours backward (two passes) ms", "cuDNN backward ms",
                              "Gluon backward ms", "its config", "Gluon / two passes",
                              "Gluon / cuDNN", "two passes / cuDNN",
                              "fastest deterministic Gluon ms", "it / cuDNN"], summary),
              markdown_table(["b x seq x d", "ours forward ms", "cuDNN forward ms",
                              "ours fwd + two passes / cuDNN fwd + bwd",
                              "ours fwd + fastest Gluon / cuDNN",
                              "ours fwd + deterministic Gluon / cuDNN"], totals),
              markdown_table(["b x seq x d", "Gluon config", "backward ms", "/ two passes",
                              "/ cuDNN", "dQ max diff, two runs"], configs)]
    return ("\n\n".join(t for t in tables if t)
            + "\n\nTime: device time (`triton.testing.do_bench` medians), each backward "
            "alone; the Gluon backwards' times include computing D, zeroing the fp32 dQ "
            f"accumulator and its final cast ({_preparation(data['rows'])}). Deterministic: "
            "dQ added in a fixed order (dQ ordered; in the study's own kernels, "
            f"{', '.join(DETERMINISTIC_DQ_MODES)}) and two runs' dQs equal. "
            f"From `{file}` ({data.get('device')}, torch {data.get('torch')}, "
            f"Triton {data.get('triton')}; kernels of commit {data.get('commit')}).\n")


# Each kernel of a forward + backward, by the part of the work it does: (part, substrings of
# the kernel names of ours and of cuDNN's); a kernel no part names is "other".
KERNEL_PARTS = (
    ("forward", ("flash_forward_kernel", "gluon_forward_kernel", "fprop")),
    ("D = rowsum(O dO)", ("prepare_kernel", "dot_do_o")),
    ("backward", ("gluon_backward_kernel", "flash_backward", "bprop")),
    ("dQ cast", ("finish_kernel", "convert_dq")),
)


def _kernel_parts(kernels: dict[str, float]) -> dict[str, float]:
    """ms per step of each part (`KERNEL_PARTS`) and "other", from ms per kernel name."""
    parts = dict.fromkeys([name for name, _ in KERNEL_PARTS] + ["other"], 0.0)
    for kernel, ms in kernels.items():
        part = next((name for name, marks in KERNEL_PARTS
                     if any(mark in kernel for mark in marks)), "other")
        parts[part] += ms
    return parts


def kernel_breakdown(repo: Path, *files: str) -> str:
    """Per head dim and implementation, device ms per step of each part of a forward +
    backward (kernels grouped by `KERNEL_PARTS`), their sum, and the sum over cuDNN's; the
    median over the runs (one file each) and, from several, each run's own ratio's range."""
    if not files:
        raise ValueError("attention-kernel-breakdown needs at least one run file")
    runs = [_experiment(repo, name) for name in files]
    parts: dict[tuple[int, str], list[dict[str, float]]] = {}
    ratios: dict[tuple[int, str], list[float]] = {}
    for run in runs:
        sums = {(row["head_dim"], row["implementation"]): row["kernel_ms_per_step"]
                for row in run["rows"] if "kernels" in row}
        for row in run["rows"]:
            if "kernels" not in row:
                continue
            key = (row["head_dim"], row["implementation"])
            parts.setdefault(key, []).append(
                {**_kernel_parts(row["kernels"]), "all kernels": row["kernel_ms_per_step"],
                 "CUDA events": row["event_ms_per_step"]})
            rival = sums.get((row["head_dim"], VARIANT_RIVAL))
            if rival:
                ratios.setdefault(key, []).append(row["kernel_ms_per_step"] / rival)
    if not parts:
        raise ValueError(f"{', '.join(files)} hold no timed rows")
    columns = [name for name, _ in KERNEL_PARTS] + ["other", "all kernels", "CUDA events"]
    order = list(VARIANT_LABELS)
    rows = []
    for d, impl in sorted(parts, key=lambda key: (key[0], order.index(key[1])
                                                  if key[1] in order else len(order))):
        measured = parts[d, impl]
        ratio = ratio_spread(ratios[d, impl]) if (d, impl) in ratios else "-"
        rows.append([d, VARIANT_LABELS.get(impl, impl),
                     *(f"{statistics.median(m[c] for m in measured):.3f}" for c in columns),
                     ratio])
    table = markdown_table(["d", "implementation", *(f"{c} ms" for c in columns),
                            "all kernels / cuDNN's"], rows)
    sources = "; ".join(f"`{name}` (commit {run.get('commit', 'not recorded')})"
                        for name, run in zip(files, runs, strict=True))
    return (f"{table}\n\nTime: device time per forward + backward step (torch.profiler's kernel "
            "times, summed per part), and CUDA events around the same number of steps in "
            f"their own window; medians over {len(runs)} run(s), a ratio the median of the "
            f"runs' own (lowest to highest). {runs[0].get('header', '')} From {sources}.\n")


def _forward_config(row: dict) -> str:
    return (f"Gluon: {row['num_stages']} stages, "
            f"{'softmax overlapped' if row['async_mma'] else 'no overlap'}, "
            f"{'ping-pong' if row['pingpong'] else 'no ping-pong'}"
            f"{', persistent' if row.get('persistent') else ''}")


def gluon_forward(repo: Path, file: str) -> str:
    """The Gluon forward study: per head dim each forward's do_bench median beside the
    Triton forward's, with its errors against fp32; then its rounds (every entry timed
    once per round, in turn): median ms over the rounds, and for the perf cases' steps
    the median and range of their per-round ratios to cuDNN's step."""
    data = _experiment(repo, file)
    rows = data["rows"]
    forwards = [r for r in rows if r.get("kind") in ("triton_forward", "gluon_forward")]
    triton = {r["head_dim"]: r["ms"] for r in forwards if r["kind"] == "triton_forward"}
    configs = []
    for r in forwards:
        label = "ours, Triton" if r["kind"] == "triton_forward" else _forward_config(r)
        if "error" in r:
            configs.append([r["head_dim"], label, f"failed: {r['error']}", "-", "-", "-"])
            continue
        configs.append([r["head_dim"], label, f"{r['ms']:.3f}",
                        f"{r['ms'] / triton[r['head_dim']]:.2f}" if r["head_dim"] in triton
                        else "-", f"{r['o_vs_ref']:.1e}", f"{r['lse_vs_ref']:.1e}"])
    rounds = [r for r in rows if r.get("kind") == "rounds"]
    if not configs or not rounds:
        raise ValueError(f"{file}: no forward rows or no rounds")
    timed = [[r["head_dim"], r["name"], f"{r['median_ms']:.3f}",
              f"{min(r['ms_per_round']):.3f}–{max(r['ms_per_round']):.3f}",
              _ratio_to_cudnn(r)] for r in rounds]
    count = len(rounds[0]["ms_per_round"])
    return (markdown_table(["d", "forward", "ms", "/ Triton forward", "O max error",
                            "L max error"], configs)
            + "\n\n" + markdown_table(["d", "timed", "median ms", "range ms",
                                        "/ cuDNN's step"], timed)
            + "\n\nTime: device time (`triton.testing.do_bench` medians), 16 matrices x "
            "16384, bf16, causal. First table: each forward alone, errors against an fp32 "
            "reference on two matrices. Second: "
            f"{count} rounds, each timing every entry once in turn; a step's ratio is the "
            "median of its per-round ratios to cuDNN's step of the same round (lowest to "
            "highest). \"step\" rows are the perf cases' forward + backward through "
            "autograd; the others call the kernels directly. "
            f"From `{file}` ({data.get('device')}, torch {data.get('torch')}, Triton "
            f"{data.get('triton')}, cuDNN {data.get('cudnn')}; commit {data.get('commit')}).\n")


def _stored_ratio(median: float, bounds: list[float]) -> str:
    """A run's stored median ratio with its stored (lowest, highest) per-round ratios."""
    low, high = bounds
    return f"{median:.3f} ({low:.3f}–{high:.3f})"


def _ratio_to_cudnn(row: dict) -> str:
    if "over_cudnn_median" not in row:
        return "-"
    return _stored_ratio(row["over_cudnn_median"], row["over_cudnn_range"])


def _at_library_height(rows: list[dict]) -> list[dict]:
    """A study run's Gluon rows at the library's tile height: the study times the library's
    configs first."""
    tried = [r for r in rows if r.get("kind") == "gluon"]
    return [r for r in tried if r["config"]["block_m"] == tried[0]["config"]["block_m"]]


def _from_runs(files: tuple[str, ...], runs: list[dict]) -> str:
    """"From ..." naming the study runs' files, grouped by folder, GPU and commit."""
    sources: dict[tuple[str, str], list[str]] = {}  # (folder, GPU and commit): files
    for name, data in zip(files, runs, strict=True):
        run = f"{data.get('device')}, commit {data.get('commit')}"
        sources.setdefault((str(Path(name).parent), run), []).append(Path(name).name)
    return "From " + "; ".join(f"`{folder}/` ({', '.join(names)}; {run})"
                               for (folder, run), names in sources.items()) + ".\n"


def _ordered(rows: list[dict], schedule: str, writers: tuple[int, ...], chains: int = 1,
             ordered: bool = True) -> dict:
    """The fastest config of this schedule with one of these writer counts, adding dQ on
    this many chains of accumulators, in a fixed order (or, `ordered` False, not)."""
    return _fastest([r for r in rows if bool(r["config"].get("ordered")) == ordered
                     and r["config"]["schedule"] == schedule
                     and r["config"]["writers"] in writers
                     and r["config"].get("chains", 1) == chains])


def _gluon_runs(repo: Path, block: str, files: tuple[str, ...]
                ) -> tuple[list[dict], list[list[dict]]]:
    """The study runs `files` and each one's Gluon rows at the library's tile height, for
    the generated block `block`; ValueError where there are no files or a run has none."""
    if not files:
        raise ValueError(f"{block} needs at least one run file")
    runs = [_experiment(repo, name) for name in files]
    gluon = [_at_library_height(data["rows"]) for data in runs]
    for name, rows in zip(files, gluon, strict=True):
        if not rows:
            raise ValueError(f"{name}: no Gluon configs")
    return runs, gluon


def ordered_schedules(repo: Path, *files: str) -> str:
    """Per shape (one study run each), the ordered Gluon backward in each launch order
    beside the fastest unordered config, our two passes and cuDNN's backward: which order
    a fixed dQ order needs at each length."""
    if not files:
        raise ValueError("attention-gluon-schedules needs at least one run file")
    runs = [_experiment(repo, name) for name in files]
    table = []
    for data in runs:
        rows = data["rows"]
        two_pass = next(r for r in rows if r.get("kind") == "two_pass")
        cudnn = next((r for r in rows if r.get("kind") == "cudnn"), {})
        gluon = _at_library_height(rows)
        unordered = _fastest([r for r in gluon if not r["config"]["ordered"]])
        alternating = _ordered(gluon, "alternating", (2,))
        longest = _ordered(gluon, "longest_first", (1,))
        shortest = _ordered(gluon, "shortest_first", (1, 2))
        table.append([_shape(two_pass), _ms(two_pass, "backward_ms"),
                      _ms(cudnn, "backward_ms"), _ms(unordered, "backward_ms"),
                      _ms(alternating, "backward_ms"), _ms(longest, "backward_ms"),
                      _ms(shortest, "backward_ms"), _ratio(longest, alternating),
                      _ratio(longest, cudnn)])
    return (markdown_table(["b x seq x d", "two passes ms", "cuDNN ms", "unordered ms",
                            "ordered, alternating ms", "ordered, longest first ms",
                            "ordered, shortest first ms", "longest first / alternating",
                            "longest first / cuDNN"], table)
            + "\n\nTime: device time (`triton.testing.do_bench` medians) of the backward "
            "alone, bf16, causal; b = batch x heads. Ordered columns: dQ added in a fixed "
            "order; alternating with two dQ writers, longest first with one, shortest first "
            "the faster of one or two; unordered: the fastest config. "
            + _from_runs(files, runs))


def longest_first_chains(repo: Path, *files: str) -> str:
    """Per shape (one study run each), the ordered backward launched longest first on 1, 2
    and 4 chains of dQ accumulators beside alternating and the fastest unordered config:
    what chains buy longest first where the matrices outnumber what the SMs hold."""
    runs, per_run = _gluon_runs(repo, "attention-gluon-chains", files)
    table = []
    for gluon in per_run:
        unordered = _fastest([r for r in gluon if not r["config"]["ordered"]])
        alternating = _ordered(gluon, "alternating", (1, 2))
        longest = [_ordered(gluon, "longest_first", (1, 2), chains) for chains in (1, 2, 4)]
        table.append([_shape(gluon[0]), _ms(unordered, "backward_ms"),
                      _ms(alternating, "backward_ms"),
                      *(_ms(row, "backward_ms") for row in longest),
                      _ratio(longest[1], alternating)])
    return (markdown_table(["b x seq x d", "unordered ms", "ordered, alternating ms",
                            "longest first ms", "on 2 chains ms", "on 4 chains ms",
                            "2 chains / alternating"], table)
            + "\n\nTime: device time (`triton.testing.do_bench` medians, each config once) "
            "of the backward alone, bf16, causal; b = batch x heads; at the library's tile "
            "height. Ordered columns: dQ added in a fixed order, each the faster of one or "
            "two dQ writers; unordered: the fastest config. " + _from_runs(files, runs))


def launch_orders(repo: Path, *files: str) -> str:
    """Per shape (one study run each) and launch order, the fastest unordered and ordered
    configs (one chain, either writer count) at the library's tile height: what each
    order costs with and without a fixed dQ order."""
    runs, per_run = _gluon_runs(repo, "attention-gluon-launch-orders", files)
    table = []
    for gluon in per_run:
        for schedule in dict.fromkeys(r["config"]["schedule"] for r in gluon):
            unordered = _ordered(gluon, schedule, (1, 2), ordered=False)
            ordered = _ordered(gluon, schedule, (1, 2))
            table.append([_shape(gluon[0]), schedule.replace("_", " "),
                          _ms(unordered, "backward_ms"), _ms(ordered, "backward_ms"),
                          _ratio(ordered, unordered)])
    return (markdown_table(["b x seq x d", "launch order", "unordered ms", "ordered ms",
                            "ordered / unordered"], table)
            + "\n\nTime: device time (`triton.testing.do_bench` medians, each config once) "
            "of the backward alone, bf16, causal; b = batch x heads; at the library's tile "
            "height, one dQ accumulator; each the fastest config of its order and kind. "
            + _from_runs(files, runs))


_SPLIT_NAMES = {"triton": "ours (default)", "sdpa_cudnn": "SDPA cuDNN",
                "fa4": "FlashAttention-4"}


def forward_backward_split(repo: Path, file: str) -> str:
    """FlashAttention-4's split run (studies/attention_fa4/split.py): per shape, each
    implementation's forward and backward apart, and each one's median per-round ratio to
    FlashAttention-4's (lowest to highest)."""
    data = _experiment(repo, file)
    table = []
    for row in data["rows"]:
        cells = ["x".join(map(str, row["shape"])), _SPLIT_NAMES.get(row["implementation"],
                                                                   row["implementation"])]
        for step in ("forward", "backward"):
            cells += [f"{row[f'{step}_ms']:.3f}",
                      _stored_ratio(row[f"{step}_over_fa4"], row[f"{step}_over_fa4_range"])]
        table.append(cells)
    return (markdown_table(["batch x heads x seq x d", "implementation", "forward ms",
                            "forward / FA4", "backward ms", "backward / FA4"], table)
            + "\n\nTime: device time (do_bench), bf16, causal; medians over rounds taken in "
            "turn (each implementation's forward, then its backward alone from one saved "
            "forward); a ratio is the median of the per-round ratios to FlashAttention-4's "
            f"(lowest to highest). From `{file}` ({data.get('device')}, torch "
            f"{data.get('torch')}, Triton {data.get('triton')}, commit {data.get('commit')}).\n")


def trees_in_turn(repo: Path, file: str) -> str:
    """A run of studies/attention_gluon_backward/against.py: per shape and mode (ordered,
    the default, and unordered), this tree's and the other's backward and the median
    per-round ratio (lowest to highest), and whether the ordered dQs were bit-identical."""
    data = _experiment(repo, file)
    table = []
    for row in data["rows"]:
        for mode in ("ordered", "unordered"):
            same = "yes" if row["ordered_dq_bit_identical"] else "no"
            table.append([row["shape"], mode, f"{row[f'{mode}_this_ms']:.3f}",
                          f"{row[f'{mode}_other_ms']:.3f}",
                          _stored_ratio(row[f"{mode}_this_over_other"],
                                        row[f"{mode}_ratio_range"]),
                          same if mode == "ordered" else ""])
    return (markdown_table(["batch x heads x seq x d", "backward", f"{data.get('commit')} ms",
                            "other ms", f"{data.get('commit')} / other", "dQ bit-identical"],
                           table)
            + f"\n\nTime: device time (do_bench medians of the Gluon backward with D and the "
            f"dQ cast), bf16, causal; medians over {data.get('rounds')} rounds, each running "
            "the two trees in turn in processes of their own; a ratio is the median of the "
            f"per-round ratios (lowest to highest). The other tree: `{data['rows'][0]['other']}`"
            f". From `{file}` ({data.get('device')}, torch {data.get('torch')}, Triton "
            f"{data.get('triton')}).\n")


_TILE_END_ORDERS = ((False, False), (True, False), (True, True))  # (async_mma, dq_first)


def _config_label(config: dict) -> str:
    chains = config.get("chains", 1)
    return (f"{'ordered' if config['ordered'] else 'unordered'}, "
            f"{config['schedule'].replace('_', ' ')}, {config['writers']} writer"
            f"{'s' if config['writers'] > 1 else ''}"
            f"{f', {chains} chains' if chains > 1 else ''}")


def tile_end_orders(repo: Path, *files: str) -> str:
    """Per shape (one study run each), every config the study timed in all three orders of
    a tile's last matmuls (synchronous; overlapped, dQ last; FA3's, dQ first), at the
    library's tile height: which order each config should take."""
    if not files:
        raise ValueError("attention-gluon-orders needs at least one run file")
    runs = [_experiment(repo, name) for name in files]
    table = []
    for name, data in zip(files, runs, strict=True):
        timed = [r for r in _at_library_height(data["rows"]) if "backward_ms" in r]
        if not timed:
            raise ValueError(f"{name}: no timed Gluon configs")
        groups: dict[tuple, dict[tuple[bool, bool], dict]] = {}
        for row in timed:
            config = row["config"]
            key = (config["ordered"], config["schedule"], config["writers"],
                   config.get("chains", 1))
            order = (config["async_mma"], config.get("dq_first", False))
            groups.setdefault(key, {})[order] = row
        for orders in groups.values():
            if len(orders) < len(_TILE_END_ORDERS):
                continue
            sync, overlapped, fa3 = (orders[o] for o in _TILE_END_ORDERS)
            table.append([_shape(sync), _config_label(sync["config"]),
                          _ms(sync, "backward_ms"), _ms(overlapped, "backward_ms"),
                          _ms(fa3, "backward_ms"), _ratio(fa3, sync)])
    return (markdown_table(["b x seq x d", "config", "synchronous ms", "overlapped, dQ last ms",
                            "FA3's order ms", "FA3's / synchronous"], table)
            + "\n\nTime: device time (`triton.testing.do_bench` medians, each config once) "
            "of the backward alone, bf16, causal; b = batch x heads; at the library's tile "
            "height. Orders of a tile's last matmuls: synchronous (dV, dK, then dQ after a "
            "barrier), overlapped with dQ last, and FA3's (dV, dQ, dK back to back, dQ "
            "handed over under dK). " + _from_runs(files, runs))


def tile_order(repo: Path, file: str) -> str:
    """The tile-order study: per shape the rule sections, each kernel's device time in one
    section and in the library's sections, and the median (range) of their per-round
    ratios; then the shapes it leaves in one section."""
    data = _experiment(repo, file)
    rows, kept = [], []
    for row in data["rows"]:
        shape = "x".join(map(str, row["shape"]))
        ms = row["ms_per_round"]
        if not any(key.startswith("library: ") for key in ms):
            kept.append(shape)
            continue
        cudnn = f"{statistics.median(ms['cudnn: forward']):.3f}"
        for key, rounds in ms.items():
            if not key.startswith("library: "):
                continue
            kernel = key.removeprefix("library: ")
            whole = ms[f"one section: {kernel}"]
            ratios = [a / b for a, b in zip(rounds, whole, strict=True)]
            rows.append([shape, row["sections_of"], kernel, f"{statistics.median(whole):.3f}",
                         f"{statistics.median(rounds):.3f}", ratio_spread(ratios), cudnn])
    if not rows:
        raise ValueError(f"{file}: no shape ran in sections")
    identical = all(row["identical"] for row in data["rows"])
    return (markdown_table(["matrices x seq x d", "matrices per section", "kernel",
                            "one section ms", "sections ms", "sections / one section",
                            "cuDNN forward ms"], rows)
            + f"\n\nLeft in one section by the rule: {', '.join(kept) or 'none'}. Outputs in "
            f"sections {'equal' if identical else 'DIFFER FROM'} one section's bit for bit "
            "(NaN-poisoned replayed calls). Time: device time of CUDA-graph replays "
            f"(do_bench medians), {data['rounds']} rounds taken in turn with cuDNN's forward; "
            "a ratio is the median of the per-round ratios (lowest to highest). bf16, causal. "
            f"From `{file}` ({data.get('device')}, torch {data.get('torch')}, Triton "
            f"{data.get('triton')}, cuDNN {data.get('cudnn')}; commit {data.get('commit')}).\n")


def one_matrix(repo: Path, file: str) -> str:
    """The one-matrix study: a row per shape with SDPA cuDNN's backward time and, per
    backward of ours, the median (range) of its per-round ratios to it; "–" where a run did
    not time that backward."""
    data = _experiment(repo, file)
    names = list(dict.fromkeys(name for row in data["rows"] for name in row["ms_per_round"]
                               if name != "SDPA cuDNN"))
    rows = []
    for row in data["rows"]:
        ms = row["ms_per_round"]
        cudnn = ms["SDPA cuDNN"]
        cells = [ratio_spread([a / b for a, b in zip(ms[name], cudnn, strict=True)])
                 if name in ms else "–" for name in names]
        rows.append(["x".join(map(str, row["shape"])), f"{statistics.median(cudnn):.3f}",
                     *cells])
    wrong = sorted({name for row in data["rows"] for name in row["wrong"]})
    return (markdown_table(["matrices x seq x d", "SDPA cuDNN ms", *names], rows)
            + "\n\nEach backward's time over SDPA cuDNN's backward. Every ordered variant's "
            + "gradients "
            + (f"DIFFERED for {', '.join(wrong)}" if wrong else
               "matched the unordered backward's within bf16 rounding and repeated bit for bit")
            + ". \"library\" is `library_config`'s pick. Time: device time (do_bench "
            f"medians), backward only, {data['rounds']} rounds taken in turn; a ratio is the "
            "median of the per-round ratios (lowest to highest). bf16, causal. From "
            f"`{file}` ({data.get('device')}, torch {data.get('torch')}, Triton "
            f"{data.get('triton')}, cuDNN {data.get('cudnn')}; commit {data.get('commit')}).\n")
