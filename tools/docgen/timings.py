"""Every saved run a doc quotes (study rows or pytest-benchmark histories) read as one shape,
so that one ratio table and one history serve every study: who took which times where."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from systems.model.recipes import RECIPES
from systems.runs import keys
from systems.runs.gate import Timing
from systems.runs.history import Result, load_run
from tools.docgen.doc_blocks import read_source

# Row fields that say which problem a row timed (the workload), not how.
SHAPE_FIELDS = ("shape", "batch", "matrices", "seq", "head_dim", "tokens", "dtype", "causal")
# Row fields naming who ran: the first present is the row's name.
NAME_FIELDS = ("implementation", "kind")


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
    shape = row.get("shape")
    if isinstance(shape, str):
        return shape
    if isinstance(shape, list):
        return "x".join(map(str, shape))
    first = row.get("batch", row.get("matrices"))
    return "x".join(str(v) for v in (first, row.get("seq"), row.get("head_dim")) if v is not None)


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
    versions = "".join(f", {label} {data[k]}" for label, k in (("torch", "torch"),
                                                               ("Triton", "triton"))
                       if data.get(k))
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


def _case_timings(r: Result, time: str) -> list[Timed]:
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
    """A study's rows matching `where` (timed by field `time` without rounds), or a history's
    cases timed as `time` says (default in_turn; several comma-separated, each a variant)."""
    data = read_source(repo, name, "saved run")
    if not isinstance(data, dict) or "benchmarks" not in data:
        return _study(data, name, time or "backward_ms", where or {})
    run, modes = load_run(repo / name, repo), (time or "in_turn").split(",")
    timings = [replace(t, what=t.what or (mode if len(modes) > 1 else ""))
               for r in run.results if r.kind in ("attention", "recipe")
               and _case_matches(r, where or {}) for mode in modes for t in _case_timings(r, mode)]
    commit = str((data.get("commit_info") or {}).get("id") or "not recorded")
    return timings, Source(name, run.device, commit[:7], run.datetime[:10], "")
