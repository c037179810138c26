"""The generators behind the docs' generated blocks (`systems.report.doc_blocks`).

Each takes its sources as paths relative to the repository root and returns markdown that
ends with what its numbers measure and which file (and commit) they come from. Ratios are
ours / rival, of medians measured in one run of one file: below 1, ours takes less time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from systems.bench import drift, gate
from systems.report import keys
from systems.report.doc_blocks import Generator
from systems.report.history import Result, load_run, read_run
from systems.report.markdown import markdown_table

OURS = "triton"
RIVALS = ("sdpa_flash", "sdpa_cudnn", "flex_compiled")
LABELS = {"triton": "ours", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN",
          "flex_compiled": "flex (compiled)", "sdpa": "SDPA (own choice)",
          "triton_compiled": "ours, torch.compile"}


@dataclass(frozen=True)
class History:
    """One saved run file: its results and where they come from."""

    label: str
    commit: str
    recorded: str
    results: list[Result]

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
    return History(name, commit, run.datetime[:10] or "date not recorded", run.results)


def _shape(r: Result) -> str:
    return f"{r.get(keys.BATCH_HEADS)}x{r.get(keys.SEQ_LEN)}x{r.get(keys.HEAD_DIM)}"


def _short_dtype(name: object) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(name), str(name))


def _dtype(r: Result) -> str:
    return _short_dtype(r.get(keys.DTYPE))


def _workload(r: Result) -> tuple:
    return (r.get(keys.HEAD_DIM), r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN), _dtype(r),
            bool(r.get(keys.CAUSAL)))


def rival_table(results: Sequence[Result], seconds: Callable[[Result], float | None]) -> str:
    """Per workload: ours and each rival in ms, then ours / rival; a last paragraph lists
    where each ratio is below 1. Implementations other than ours and the rivals are left
    out; a workload without ours is left out."""
    by_workload: dict[tuple, dict[str, float]] = {}
    for r in results:
        impl, value = str(r.get(keys.IMPLEMENTATION)), seconds(r)
        if impl in (OURS, *RIVALS) and isinstance(value, int | float):
            by_workload.setdefault(_workload(r), {})[impl] = value
    rivals = [i for i in RIVALS if any(i in times for times in by_workload.values())]
    rows, below = [], {rival: [] for rival in rivals}
    for workload, times in sorted(by_workload.items()):
        if OURS not in times:
            continue
        d, batch_heads, seq, dtype, causal = workload
        ratios = []
        for rival in rivals:
            ratio = times[OURS] / times[rival] if rival in times else None
            ratios.append("-" if ratio is None else f"{ratio:.2f}")
            if ratio is not None and ratio < 1:
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
    return f"{table}\n\nOurs takes less time than (ours / rival below 1): {wins}.\n"


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


def attention_device_time(repo: Path, history_file: str) -> str:
    """Device time: `test_attention_device_time` (CUDA-graph replay) and the leaderboard
    case's do_bench medians, one table each."""
    history = read_history(repo, history_file)
    replay = _only(history.results, "test_attention_device_time", lambda r: True)
    board = _only(history.results, "test_attention_leaderboard",
                  lambda r: isinstance(r.get(keys.DO_BENCH_MEDIAN_MS), int | float))
    parts = []
    if replay:
        parts.append(_block(history, replay, _median))
    if board:
        parts.append(_block(history, board,
                            lambda r: r.get(keys.DO_BENCH_MEDIAN_MS) / 1e3,  # type: ignore[operator]
                            keys.DO_BENCH_TIME))
    if not parts:
        raise ValueError(f"{history.label} holds no device-time attention cases")
    return "\n".join(parts)


# Host-path profiles (scripts/attention_host_profile.py): JSON files of their own.

def _profile(repo: Path, name: str) -> dict:
    try:
        data = json.loads((repo / name).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{name}: not a host profile ({error})") from error
    if not isinstance(data, dict) or "host_profile" not in data:
        raise ValueError(f"{name}: not a host profile (no host_profile)")
    return data


def _profile_source(names: Sequence[str], profiles: Sequence[dict], what: str) -> str:
    machines = sorted({f"{p.get('gpu')}, torch {p.get('torch')}" for p in profiles})
    files = ", ".join(f"`{n}`" for n in names)
    return (f"Time: eager, host included; {what}. From {files} "
            f"({'; '.join(machines)}; the files record no commit).\n")


def _impl_profile(profile: dict, impl: str) -> dict:
    """One implementation's host profile; the script's first version profiled ours only
    and stored it unkeyed."""
    host = profile["host_profile"]
    if "enqueue_us_per_call" in host:
        return host if impl == OURS else {}
    return host.get(impl) or {}


def host_profile(repo: Path, impl: str, *files: str) -> str:
    """Per profile file (a column each): `impl`'s enqueue time per call and cProfile's own
    time per call by group, in us."""
    if not files:
        raise ValueError("name at least one host profile file")
    profiles = [_profile(repo, f) for f in files]
    per_file = [_impl_profile(p, impl) for p in profiles]
    groups = sorted({g for pf in per_file for g in pf.get("profiled_us_per_call_by_group", {})},
                    key=lambda g: -max(pf.get("profiled_us_per_call_by_group", {}).get(g, 0)
                                       for pf in per_file))

    def cell(value: object) -> str:
        return "-" if value is None else f"{float(value):.0f}"

    rows = [["enqueue per call (not profiled)",
             *(cell(pf.get("enqueue_us_per_call")) for pf in per_file)]]
    rows += [[group, *(cell(pf.get("profiled_us_per_call_by_group", {}).get(group))
                       for pf in per_file)] for group in groups]
    headers = ["where", *(f"{p.get('label', f)} us" for p, f in zip(profiles, files, strict=True))]
    return (markdown_table(headers, rows) + "\n\n"
            + _profile_source(files, profiles, f"{LABELS.get(impl, impl)}, per forward + "
                              "backward call: enqueue is perf_counter over back-to-back calls; "
                              "the other rows are cProfile's own time, inflated by the "
                              "profiler (compare rows with each other)"))


def host_timings(repo: Path, file: str) -> str:
    """The profile's interleaved eager rounds: every implementation per shape, ours / SDPA
    flash; and the model steps eager vs compiled, if recorded."""
    profile = _profile(repo, file)
    by_shape: dict[tuple, dict[str, float]] = {}
    rounds = set()
    for t in profile.get("timings", []):
        shape = "x".join(map(str, t["shape"]))
        by_shape.setdefault((shape, _short_dtype(t["dtype"])), {})[t["impl"]] = t["median_ms"]
        rounds.add(t.get("rounds"))
    impls = [i for i in ("triton", "sdpa_flash", "sdpa_cudnn", "sdpa", "triton_compiled")
             if any(i in times for times in by_shape.values())]
    rows = [[shape, dtype, *(f"{times[i]:.3f}" if i in times else "-" for i in impls),
             f"{times['triton'] / times['sdpa_flash']:.2f}"
             if {"triton", "sdpa_flash"} <= times.keys() else "-"]
            for (shape, dtype), times in by_shape.items()]
    parts = [markdown_table(["b x h x seq x d", "dtype", *(f"{LABELS[i]} ms" for i in impls),
                             "ours / SDPA flash"], rows)]
    models = profile.get("compiled_model", [])
    if models:
        parts.append(markdown_table(["model", "batch x seq", "mode", "ms"],
                                    [[m["model"], f"{m['batch']}x{m['seq']}", m["mode"],
                                      f"{m['median_ms']:.2f}"] for m in models]))
    what = (f"forward + backward, medians of {', '.join(map(str, sorted(rounds)))} interleaved "
            "rounds of back-to-back calls, in ms; the model rows are bf16 forward + backward "
            "steps")
    return "\n\n".join(parts) + "\n\n" + _profile_source([file], [profile], what)


# The gate: its constants, its printed tables, and the drift behind its floor.

def gate_constants() -> str:
    """The thresholds `systems.bench.gate` applies."""
    return (f"- **threshold** = max(**floor {gate.FLOOR:.0%}**, **{gate.SPREAD_FACTOR:g} x "
            f"spread**); a case whose threshold would exceed the **ceiling of "
            f"{gate.CEILING:.0%}** (spread above {gate.CEILING / gate.SPREAD_FACTOR:.0%}) is "
            "`not gated`. (Constants of `systems.bench.gate`.)\n")


_GATE_ROW = re.compile(r"^(?P<case>\S+::\S+)\s+(?P<base>[\d.]+)\s+(?P<cur>[\d.]+)\s+"
                       r"(?P<change>[+-][\d.]+%)\s+(?P<threshold>[\d.]+%)\s+(?P<verdict>.+)$")
_GATE_BASELINE = re.compile(r"medians vs (?P<baseline>\S+)")
_GATE_TALLY = re.compile(r"^\d+ (ok|SLOWER|faster|not gated)")


@dataclass(frozen=True)
class GateTable:
    file: str
    baseline: str
    tally: str
    rows: list[dict[str, str]]


def read_gate_table(repo: Path, name: str) -> GateTable:
    lines = (repo / name).read_text().splitlines()
    baseline = next((m["baseline"] for line in lines if (m := _GATE_BASELINE.search(line))), None)
    tally = next((line for line in lines if _GATE_TALLY.match(line)), None)
    rows = [m.groupdict() for line in lines if (m := _GATE_ROW.match(line.strip()))]
    if baseline is None or tally is None or not rows:
        raise ValueError(f"{name}: not a gate table as the perf session prints it")
    return GateTable(name, baseline, tally, rows)


def _gate_source(tables: Sequence[GateTable]) -> str:
    baselines = sorted({t.baseline for t in tables})
    return ("Time: each case's pytest-benchmark round medians (eager end-to-end, or device "
            "time for CUDA-graph replay cases), run against the baseline's; quoted from the "
            f"gate tables {', '.join(f'`{t.file}`' for t in tables)}, which compared with "
            f"{', '.join(f'`{b}`' for b in baselines)} as it was then.\n")


def gate_tallies(repo: Path, *files: str) -> str:
    """Per printed gate table: its tally and the cases it flagged."""
    tables = [read_gate_table(repo, f) for f in files]
    rows = [[f"`{Path(t.file).name}`", t.tally,
             "; ".join(f"{_case(r['case'])}: {r['base']} -> {r['cur']} ms ({r['change']}, "
                       f"threshold {r['threshold']}, {r['verdict']})"
                       for r in t.rows if r["verdict"] in ("SLOWER", "faster")) or "none"]
            for t in tables]
    return (markdown_table(["gate table", "tally", "flagged cases"], rows) + "\n\n"
            + _gate_source(tables))


def _case(name: str) -> str:
    return name.split("::")[-1]


def gate_cases(repo: Path, file: str, match: str) -> str:
    """The rows of one printed gate table whose case name contains `match`."""
    table = read_gate_table(repo, file)
    rows = [[_case(r["case"]), r["base"], r["cur"], r["change"], r["threshold"], r["verdict"]]
            for r in table.rows if match in r["case"]]
    if not rows:
        raise ValueError(f"{file}: no case matches {match!r}")
    return (markdown_table(["case", "baseline ms", "current ms", "change", "threshold",
                            "verdict"], rows) + "\n\n" + _gate_source([table]))


def gate_noise(repo: Path, *files: str) -> str:
    """Across unchanged re-runs: per test function, the largest |change| of a case against
    the baseline, for cases under and over 1 ms."""
    tables = [read_gate_table(repo, f) for f in files]
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for t in tables:
        for r in t.rows:
            test = _case(r["case"]).split("[")[0]
            size = "< 1 ms" if float(r["base"]) < 1 else ">= 1 ms"
            change = float(r["change"].rstrip("%"))
            if abs(change) > abs(worst.get((test, size), (0.0, ""))[0]):
                worst[(test, size)] = (change, _case(r["case"]))
    rows = [[test, size, f"{change:+.1f}%", case]
            for (test, size), (change, case) in sorted(worst.items())]
    return (markdown_table(["test", "baseline median", "largest change", "case"], rows)
            + "\n\n" + _gate_source(tables))


def drift_summary(repo: Path, pattern: str, match: str = "") -> str:
    """`python -m systems.bench.drift` over the history files matching `pattern` (a glob
    relative to the repository root), for case names containing `match`."""
    paths = sorted(repo.glob(pattern))
    if not paths:
        raise ValueError(f"no history files match {pattern}")
    pairs = drift.drifts([read_run(p) for p in paths], match)
    rows = []
    for label, group in drift.judged_groups(pairs):
        changes = [p.change for p in group]
        rows.append([label, len(group), len({p.name for p in group}),
                     *(f"{drift.quantile(changes, q):.1%}" if changes else "-"
                       for q in (.5, .9, .95)),
                     f"{max(changes):.1%}" if changes else "-"])
    flagged = drift.flagged(drift.judged_groups(pairs)[-1][1])
    return (markdown_table(["pairs", "count", "cases", "abs change p50", "p90", "p95", "max"],
                           rows)
            + f"\n\nThe gate's thresholds would flag {len(flagged)} of the last row's pairs.\n\n"
            f"Time: pytest-benchmark round medians of each case, consecutive distinct "
            f"measurements{f' of cases containing `{match}`' if match else ''}. From the "
            f"{len(paths)} files `{pattern}`.\n")


def generators(repo: Path) -> dict[str, Generator]:
    """Every generator by the name a doc's block uses, reading sources under `repo`."""
    return {
        "attention-eager": partial(attention_eager, repo),
        "attention-device-time": partial(attention_device_time, repo),
        "attention-host-profile": partial(host_profile, repo),
        "attention-host-timings": partial(host_timings, repo),
        "gate-constants": gate_constants,
        "gate-tallies": partial(gate_tallies, repo),
        "gate-cases": partial(gate_cases, repo),
        "gate-noise": partial(gate_noise, repo),
        "drift": partial(drift_summary, repo),
    }
