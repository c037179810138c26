"""The blocks every study shares, over any saved run read here as one shape (who took which
times of which workload), whether a study's rows or a pytest-benchmark history:

    <!-- generated: ratios FILE... against=WHO clock="..." [time= where=K:V,... fastest=
         layout=wide ours=WHO rate=yes] -->
    <!-- generated: history FILE... ours=WHO against=WHO clock="..." [where=K:V,...] -->
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from systems.common.formatting import markdown_table
from systems.model.recipes import RECIPES
from systems.profiling.step_breakdown import DEFAULT_MATMUL_TFLOPS
from systems.runs import keys
from systems.runs.gate import HOST_BOUND_SHARE, Timing
from systems.runs.history import Result, load_run
from tools.docgen.doc_blocks import read_source

# Row fields that say which problem a row timed (the workload), not how.
SHAPE_FIELDS = ("shape", "batch", "matrices", "seq", "head_dim", "tokens", "dtype", "causal")
# Row fields naming who ran: the first present is the row's name.
NAME_FIELDS = ("implementation", "kind")
HOST_BOUND_MARK = "†"


@dataclass(frozen=True)
class Timed:
    """`who` timed at step `what` ("": the whole call) of a workload: ms per round, and the
    (median, lowest, highest) ratios the run stored against others."""

    workload: str
    who: str
    what: str
    ms: tuple[float, ...]
    stored: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # what the row's run chose, if it chose
    host_bound: bool = False  # its rounds timed the host (`Timing.host_bound`)
    flops: float | None = None  # the work of one call, where the run counted it
    extremes: tuple[float, float] | None = None  # its fastest and slowest round, in ms

    @property
    def median(self) -> float:
        return statistics.median(self.ms)


@dataclass(frozen=True)
class Source:
    name: str
    device: str
    commit: str
    recorded: str
    versions: str
    differed: tuple[str, ...] = ()  # workloads whose outputs a run's check found wrong

    def __str__(self) -> str:
        return (f"`{self.name}` ({self.device}{self.versions}; commit {self.commit}"
                f"{', recorded ' + self.recorded if self.recorded else ''}"
                + (f"; outputs DIFFERED at {', '.join(self.differed)}" if self.differed
                   else "") + ")")


def _workload(row: dict) -> str:
    shape = row.get("shape") or [v for v in (row.get("batch", row.get("matrices")),
                                             row.get("seq"), row.get("head_dim")) if v is not None]
    return shape if isinstance(shape, str) else "x".join(map(str, shape))


def _config(row: dict) -> dict:
    """What a row's run chose (its config, or its own scalar fields)."""
    if isinstance(row.get("config"), dict):
        return {**row["config"], **({"library": row["library"]} if "library" in row else {})}
    return {k: v for k, v in row.items() if isinstance(v, bool | int | str | list)
            and k not in (*SHAPE_FIELDS, *NAME_FIELDS, "wrong")}


def _row_timings(row: dict, time: str) -> list[Timed]:
    workload = _workload(row)
    if isinstance(row.get("ms_per_round"), dict):  # {who: ms per round}, "who: what" keys
        return [Timed(workload, *(name.split(": ", 1) if ": " in name else (name, "")),
                      tuple(ms)) for name, ms in row["ms_per_round"].items()]
    if isinstance(row.get("ms"), dict):  # {who: ms}, per-round ratios to the default stored
        over = row.get("over_default", {})
        default = next((name for name, r in over.items() if r == 1.0), "")
        return [Timed(workload, name, "", (ms,),
                      {default: (over[name],) * 3} if name in over else {})
                for name, ms in row["ms"].items()]
    if rounds := [k for k in row if k.endswith("_rounds_ms")]:  # per step, one time a round
        return [Timed(workload, str(row["implementation"]), k.removesuffix("_rounds_ms"),
                      tuple(row[k])) for k in rounds]
    if modes := [k.removesuffix("_this_ms") for k in row if k.endswith("_this_ms")]:
        # this tree beside another, the per-round ratio stored
        return [t for mode in modes for t in (
            Timed(workload, "this tree", mode, (row[f"{mode}_this_ms"],),
                  {"other tree": (row[f"{mode}_this_over_other"],
                                  *row[f"{mode}_ratio_range"])}),
            Timed(workload, "other tree", mode, (row[f"{mode}_other_ms"],)))]
    if isinstance(row.get(time), int | float):
        return [Timed(workload, next(str(row[k]) for k in NAME_FIELDS if k in row), "",
                      (float(row[time]),))]
    return []


def _study(data: object, name: str, time: str, where: dict[str, str]
           ) -> tuple[list[Timed], Source]:
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{name}: not a saved run (no rows)")
    # A row without a field of `where` (a rival's, where configs are narrowed) is kept.
    rows = [row for row in data["rows"] if all(
        k not in (fields := {**row, **_config(row)}) or str(fields[k]) == v
        for k, v in where.items())]
    timings = [replace(t, config=_config(row)) for row in rows for t in _row_timings(row, time)]
    versions = "".join(f", {label} {data[label.lower()]}" for label in ("torch", "Triton")
                       if data.get(label.lower()))
    differed = tuple(dict.fromkeys(_workload(row) for row in rows
                                   if row.get("wrong") or row.get("identical") is False))
    return timings, Source(name, str(data.get("device")), str(data.get("commit", "not "
                           "recorded")), "", versions, differed)


def _case_matches(r: Result, where: dict[str, str]) -> bool:
    """`where`'s `test` is the test's name, other keys extra_info, a value a|b or >n."""
    for k, wanted in where.items():
        value = r.name.split("[")[0] if k == "test" else r.get(k)
        if wanted.startswith(">"):
            if not isinstance(value, int | float) or value <= float(wanted[1:]):
                return False
        elif str(value) not in wanted.split("|"):
            return False
    return True


def _case_name(r: Result) -> tuple[str, str]:
    """(workload, implementation) of an attention case or a recipe's train step."""
    if r.kind == "recipe":
        recipe, attention = str(r.get(keys.RECIPE)), r.get(keys.ATTENTION)
        own = attention is None or attention == RECIPES[recipe].attention
        return (f"{r.get(keys.SIZE)}, ctx {r.get(keys.SEQ_LEN)}",
                recipe if own else f"{recipe}, {attention} attention")
    # bf16 and causal go unsaid: the attention cases' default.
    dtype = {"float16": " fp16", "float32": " fp32"}.get(str(r.get(keys.DTYPE)), "")
    return (f"{r.get(keys.BATCH_HEADS)}x{r.get(keys.SEQ_LEN)}x{r.get(keys.HEAD_DIM)}"
            f"{dtype}{' full' if r.get(keys.CAUSAL) is False else ''}",
            str(r.get(keys.IMPLEMENTATION)))


def case_timings(r: Result, time: str) -> list[Timed]:
    """`in_turn`, `eager_in_turn`: the case's rivals and it as "ours", its variant the
    implementation; `median` and `do_bench`: the case alone."""
    workload, impl = _case_name(r)
    field_of = {"in_turn": keys.INTERLEAVED_DEVICE_MS, "eager_in_turn": keys.INTERLEAVED_MEDIANS_S}
    if time in field_of:
        rounds = r.get(field_of[time])
        if not isinstance(rounds, dict) or impl not in rounds:
            return []
        scale = 1e3 if time == "eager_in_turn" else 1.0
        return [Timed(workload, "ours" if who == impl else who, impl,
                      tuple(v * scale for v in (ms if isinstance(ms, list) else [ms])))
                for who, ms in rounds.items()]
    ms = r.median * 1e3 if time == "median" else r.get(keys.DO_BENCH_MEDIAN_MS)
    if not isinstance(ms, int | float):
        return []
    flops = r.get("flops")
    return [Timed(workload, impl, "", (float(ms),),
                  host_bound=time == "median" and Timing.from_saved(r.stats, r.info).host_bound,
                  flops=flops if isinstance(flops, int | float) else None,
                  extremes=(r.stats["min"] * 1e3, r.stats["max"] * 1e3)
                  if time == "median" and "min" in r.stats else None)]


def read_timings(repo: Path, name: str, time: str = "",
                 where: dict[str, str] | None = None) -> tuple[list[Timed], Source]:
    """A study's rows matching `where` (without rounds: field `time`, default backward_ms), or
    a history's cases timed as `time` says (default in_turn; several comma-separated)."""
    data = read_source(repo, name, "saved run")
    if not isinstance(data, dict) or "benchmarks" not in data:
        return _study(data, name, time or "backward_ms", where or {})
    run, modes = load_run(repo / name, repo), (time or "in_turn").split(",")
    timings = [replace(t, what=t.what or (mode if len(modes) > 1 else ""))
               for r in run.results if r.kind in ("attention", "recipe")
               and _case_matches(r, where or {}) for mode in modes for t in case_timings(r, mode)]
    commit = str((data.get("commit_info") or {}).get("id") or "not recorded")
    return timings, Source(name, run.device, commit[:7], run.datetime[:10], "")


def _read_block(repo: Path, args: tuple[str, ...], allowed: set[str]
                ) -> tuple[list[str], dict[str, str], list[tuple[list[Timed], Source]]]:
    """A block's files, its options and each file's timings (an error where none match)."""
    files = [a for a in args if "=" not in a]
    options = dict(a.split("=", 1) for a in args if "=" in a)
    if unknown := set(options) - allowed:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; known: {sorted(allowed)}")
    if not files or "clock" not in options:
        raise ValueError("needs at least one run file and clock=... (what its times measure)")
    where = options.get("where", "")
    runs = [read_timings(repo, name, options.get("time", ""),
                         dict(pair.split(":", 1) for pair in where.split(",")) if where else {})
            for name in files]
    if empty := [name for name, (timings, _) in zip(files, runs, strict=True) if not timings]:
        raise ValueError(f"{empty[0]}: nothing timed matches {where!r}")
    return files, options, runs


def ratio(t: Timed, reference: Timed) -> tuple[float, float, float]:
    """(median, lowest, highest) of the per-round ratios where both took the same rounds in
    turn, else the ratio the run stored, else of medians."""
    if len(t.ms) > 1 and len(t.ms) == len(reference.ms):
        each = [a / b for a, b in zip(t.ms, reference.ms, strict=True)]
        return statistics.median(each), min(each), max(each)
    return t.stored.get(reference.who) or (t.median / reference.median,) * 3


def _ratio_cell(t: Timed, reference: Timed | None) -> str:
    if reference is None:
        return "-"
    median, low, high = ratio(t, reference)
    return (f"{median:.3f}" + (f" ({low:.3f}–{high:.3f})" if high > low else "")
            + (f" {HOST_BOUND_MARK}" if t.host_bound or reference.host_bound else ""))


def _reference(timings: list[Timed], t: Timed, against: str) -> Timed | None:
    return next((r for r in timings
                 if (r.workload, r.what, r.who) == (t.workload, t.what, against)), None)


def _fastest(timings: list[Timed], against: str, fields: list[str]) -> list[Timed]:
    """`against` and each other's fastest per workload, step and values of config `fields`."""
    best: dict[tuple, Timed] = {}
    for t in timings:
        key = (t.workload, t.what, *((t.who, *(str(t.config.get(f)) for f in fields))
                                     if fields else ()))
        if t.who != against and (key not in best or t.median < best[key].median):
            best[key] = t
    chosen = {id(t) for t in best.values()}
    return [t for t in timings if t.who == against or id(t) in chosen]


def _labelled(timings: list[Timed], fields: list[str] | None = None) -> list[Timed]:
    """Rows of one implementation and workload named by the config `fields` (one column each
    in a wide table), else by the config values that differ between them."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for t in timings:
        groups.setdefault((t.workload, t.who), []).append(t.config)
    out = []
    for t in timings:
        label = ", ".join(f"{k}={v}" for k, v in t.config.items()
                          if (k in fields if fields is not None else
                              len({str(c.get(k)) for c in groups[(t.workload, t.who)]}) > 1))
        out.append(replace(t, who=f"{t.who} ({label})" if label else t.who))
    return out


def _long(timings: list[Timed], against: str) -> tuple[list[str], list[list]]:
    """A row per implementation and workload."""
    return ["workload", "implementation", "variant", "ms", "fastest–slowest round ms",
            f"/ {against}"], [
        [t.workload, t.who, t.what, f"{t.median:.3f}",
         f"{t.extremes[0]:.1f}–{t.extremes[1]:.1f}" if t.extremes else "-",
         "1" if t.who == against and not t.stored
         else _ratio_cell(t, _reference(timings, t, against))] for t in timings]


def _wide(timings: list[Timed], against: str, ours: str = "",
          rate: bool = False) -> tuple[list[str], list[list]]:
    """A row per workload and variant: the time of `ours` over each other's, or each other's
    over `against`'s; with `rate`, the FLOP rate beside the bf16 matmul ceiling."""
    base = ours or against
    others = list(dict.fromkeys(t.who for t in timings if t.who != base))
    by_key: dict[tuple[str, str], dict[str, Timed]] = {}
    for t in timings:
        by_key.setdefault((t.workload, t.what), {})[t.who] = t
    rows = []
    for (workload, what), found in by_key.items():
        if ours and ours not in found:
            continue
        cells = ["-" if n not in found else _ratio_cell(found[ours], found[n]) if ours
                 else _ratio_cell(found[n], found.get(against)) for n in others]
        if others and set(cells) == {"-"}:
            continue  # nothing compared here: no claim to show
        tflops = (found[base].flops / found[base].median / 1e9
                  if base in found and found[base].flops else None)
        rows.append([workload, what, f"{found[base].median:.3f}" if base in found else "-",
                     *cells, *(([f"{tflops:.0f}", f"{tflops / DEFAULT_MATMUL_TFLOPS:.1%}"]
                                if tflops else ["-", "-"]) if rate else [])])
    return ["workload", "variant", f"{base} ms",
            *((f"{ours} / {n}" if ours else f"{n} / {against}") for n in others),
            *([f"{base} TFLOP/s", f"of {DEFAULT_MATMUL_TFLOPS:.0f} TFLOP/s"] if rate else [])
            ], rows


def _closing(clock: str, sources: list[Source]) -> str:
    return (f"\n\nTime: {clock}; ms: the median over a run's rounds (its one time where it "
            "took one); a ratio: the median of the per-round ratios (lowest–highest) where "
            "both took the same rounds in turn, else as the run stored it or of medians. "
            f"From {', '.join(map(str, sources))}.\n")


def ratios(repo: Path, *args: str) -> str:
    """The `ratios` block: each implementation's median and its ratio, per workload."""
    files, options, runs = _read_block(repo, args, {"against", "ours", "clock", "time", "where",
                                                    "fastest", "layout", "rate"})
    against = options.get("against", "")
    # A workload in several runs is told apart by each run's commit (or file, if shared).
    seen = Counter(w for timings, _ in runs for w in {t.workload for t in timings})
    commits = Counter(source.commit for _, source in runs)
    shown = []
    for name, (timings, source) in zip(files, runs, strict=True):
        run = source.commit if commits[source.commit] == 1 else Path(name).stem
        fields = None
        if "fastest" in options:
            fields = [f for f in options["fastest"].split(",") if f and f != "yes"]
            timings = _fastest(timings, against, fields)
        shown += [replace(t, workload=f"{t.workload} ({run})") if seen[t.workload] > 1 else t
                  for t in _labelled(timings, fields)]
    headers, rows = (_wide(shown, against, options.get("ours", ""), "rate" in options)
                     if options.get("layout") == "wide" else _long(shown, against))
    if not rows:
        raise ValueError(f"{', '.join(files)}: no row has {options.get('ours')}")
    # A column nothing filled (no variants, no rounds, compared nowhere) says nothing.
    keep = [i for i in range(len(headers)) if any(row[i] not in ("-", "") for row in rows)]
    headers, rows = [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]
    marked = any(HOST_BOUND_MARK in str(cell) for row in rows for cell in row)
    return (markdown_table(headers, rows) + _closing(options["clock"], [s for _, s in runs])
            + (f"\n{HOST_BOUND_MARK} host-bound: one side spent {HOST_BOUND_SHARE:.0%} or "
               "more of each round enqueueing, so the ratio compares the host's speed at two "
               "moments, not the kernels.\n" if marked else ""))


def history(repo: Path, *args: str) -> str:
    """The `history` block: a row per run, ours / against per workload."""
    files, options, runs = _read_block(repo, args, {"ours", "against", "clock", "where"})
    by_run = [{t.workload: ratio(t, ref)[0] for t in timings if t.who == options["ours"]
               if (ref := _reference(timings, t, options["against"]))} for timings, _ in runs]
    if empty := [name for name, cells in zip(files, by_run, strict=True) if not cells]:
        raise ValueError(f"{empty[0]}: no {options['ours']} timed with {options['against']}")
    workloads = list(dict.fromkeys(w for cells in by_run for w in cells))
    rows = [[s.device, s.commit, s.recorded, *(f"{cells[w]:.3f}" if w in cells else "-"
                                               for w in workloads)]
            for (_, s), cells in zip(runs, by_run, strict=True)]
    return (markdown_table(["GPU", "commit", "recorded", *workloads], rows)
            + f"\n\nEach cell: {options['ours']} / {options['against']}."
            + _closing(options["clock"], [s for _, s in runs]))
