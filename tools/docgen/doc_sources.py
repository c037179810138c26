"""The generators behind the docs' generated blocks (`tools.docgen.doc_blocks`), by the
name a block uses, and those that serve one doc each. Each reads its sources relative to
the repository root and ends with what its numbers measure and where they come from."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch

from systems.attention import dispatch
from systems.common.formatting import fmt, markdown_table
from systems.runs import gate
from tools.docgen import claims, doc_accounting, drift, timings
from tools.docgen.doc_blocks import Generator, read_source

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_FORWARDS = {dispatch.TRITON: "Triton", dispatch.GLUON: "Gluon"}
_BACKWARDS = {dispatch.TWO_PASS: "two passes", dispatch.GLUON_ORDERED: "Gluon, dQ in a fixed order",
              dispatch.GLUON_UNORDERED: "Gluon, dQ in arrival order"}


def dispatch_table() -> str:
    """Every rule of `systems.attention.dispatch.TABLE`, in the order the dispatch tries them."""
    rows = [[f"sm_{''.join(map(str, rule.capability))}", _DTYPES.get(rule.dtype, str(rule.dtype)),
             rule.head_dim, rule.min_seq, rule.min_tokens, _FORWARDS[rule.kernels.forward],
             _BACKWARDS[rule.kernels.backward]] for rule in dispatch.TABLE]
    forward, backward = dispatch.DEFAULT.name.split("+")
    return (markdown_table(["GPU", "dtype", "d", "seq from", "tokens from", "forward",
                            "backward"], rows)
            + f"\n\nEverything else runs {_FORWARDS[forward]} + {_BACKWARDS[backward]}. "
            "(Rows of `systems.attention.dispatch.TABLE`.)\n")


def breakdown_side_by_side(repo: Path, *files: str) -> str:
    """Kernel time per step by category, a column per `systems profile breakdown` JSON."""
    if not files:
        raise ValueError("name at least one breakdown file")
    records = [read_source(repo, name, "breakdown record") for name in files]
    by_file = [{row["category"]: row for row in record["rows"]} for record in records]
    rows = [[c, *(fmt(rows.get(c, {}).get("ms"), ".1f") for rows in by_file),
             fmt(by_file[0][c].get("floor_ms"), ".1f")]
            for c in (row["category"] for row in records[0]["rows"])]
    rows.append(["step (unprofiled)", *(f"{r['unprofiled_wall_ms']:.1f}" for r in records), "-"])
    headers = ["category", *(f"{record['recipe']} ms ({Path(name).stem})"
                             for record, name in zip(records, files, strict=True)), "floor ms"]
    machines = sorted({f"{r.get('machine')}, {r.get('measured')}, {r.get('steps')} steps"
                       for r in records})
    commits = [record.get("commit") for record in records]
    recorded = ("commits " + ", ".join(c or "not recorded" for c in commits) if any(commits)
                else "the files record no commit")
    return (markdown_table(headers, rows) + "\n\nTime: GPU kernel time per step by category "
            f"(torch.profiler). From {', '.join(f'`{name}`' for name in files)} "
            f"({'; '.join(machines)}; {recorded}).\n")


def gate_constants() -> str:
    """The thresholds `systems.runs.gate` applies."""
    return (f"- **threshold** = max(**floor {gate.FLOOR:.0%}**, **{gate.SPREAD_FACTOR:g} x "
            f"spread**, **{gate.DRIFT_FACTOR:g} x drift**); a case whose threshold would "
            f"exceed the **ceiling of {gate.CEILING:.0%}** is `not gated`, and so is a "
            f"wall-timed case whose median is under **{gate.WALL_MIN_S * 1e3:g} ms** or "
            f"whose host spent **{gate.HOST_BOUND_SHARE:.0%} of a round or more** "
            "enqueueing. (Constants of `systems.runs.gate`.)\n")


_CLOCKS = "|".join(map(re.escape, (gate.ROUNDS_WALL, gate.ROUNDS_REPLAY, *gate.DEVICE_CLOCKS)))
_GATE_ROW = re.compile(rf"^(?P<case>\S+::\S+)\s+(?:(?P<clock>{_CLOCKS})\s+)?"
                       r"(?P<base>[\d.]+)\s+(?P<cur>[\d.]+)\s+"
                       r"(?P<change>[+-][\d.]+%)\s+(?P<threshold>[\d.]+%)\s+(?P<verdict>.+)$")
# "perf gate: vs BASELINE" in a perf session ("medians vs" in older ones), "perf gate: RUN vs
# BASELINE" from `baseline judge`
_GATE_BASELINE = re.compile(r"(?:medians |perf gate: (?:\S+ )?)vs (?P<baseline>\S+)")
_GATE_TALLY = re.compile(r"^\d+ (ok|SLOWER|faster|not gated)")


class GateTable(NamedTuple):
    file: str
    baseline: str
    tally: str
    rows: list[dict[str, str]]  # _GATE_ROW's fields, and "test": the case without its path


def _read_gate_table(repo: Path, name: str) -> GateTable:
    lines = (repo / name).read_text().splitlines()
    baseline = next((m["baseline"] for line in lines if (m := _GATE_BASELINE.search(line))), None)
    tally = next((line for line in lines if _GATE_TALLY.match(line)), None)
    rows = [{**m.groupdict(), "test": m["case"].split("::")[-1]}
            for line in lines if (m := _GATE_ROW.match(line.strip()))]
    if baseline is None or tally is None or not rows:
        raise ValueError(f"{name}: not a gate table as the perf session prints it")
    return GateTable(name, baseline, tally, rows)


def _gate_block(tables: list[GateTable], headers: list[str], rows: list[list]) -> str:
    """A table of rows from printed gate tables, and where they come from."""
    baselines = sorted({t.baseline for t in tables})
    return (markdown_table(headers, rows) + "\n\nTime: each case's pytest-benchmark "
            "round medians (eager end-to-end, or device time for CUDA-graph replay cases), "
            "run against the baseline's; quoted from the gate tables "
            f"{', '.join(f'`{t.file}`' for t in tables)}, which compared with "
            f"{', '.join(f'`{b}`' for b in baselines)} as it was then.\n")


def gate_tallies(repo: Path, *files: str) -> str:
    """Per printed gate table: its tally and the cases it flagged."""
    tables = [_read_gate_table(repo, f) for f in files]
    return _gate_block(tables, ["gate table", "tally", "flagged cases"], [
        [f"`{Path(name).name}`", tally, "; ".join(
            f"{r['test']}: {r['base']} -> {r['cur']} ms ({r['change']}, threshold "
            f"{r['threshold']}, {r['verdict']})"
            for r in rows if r["verdict"] in ("SLOWER", "faster")) or "none"]
        for name, _, tally, rows in tables])


def gate_cases(repo: Path, file: str, match: str) -> str:
    """The rows of one printed gate table whose case name contains `match`."""
    table = _read_gate_table(repo, file)
    rows = [[r["test"], r["base"], r["cur"], r["change"], r["threshold"], r["verdict"]]
            for r in table.rows if match in r["case"]]
    if not rows:
        raise ValueError(f"{file}: no case matches {match!r}")
    return _gate_block([table], ["case", "baseline ms", "current ms", "change", "threshold",
                                 "verdict"], rows)


# The `dp-scaling` block, from studies/dp_scaling/study.py's `<folder>/world{1,2,4}.json`.
WORLD_SIZES = (1, 2, 4)
# Each of our variants against the torch implementation it must beat.
RIVALS = {"bucketed": "torch_ddp", "fsdp": "torch_fsdp2"}


def _busbw_table(runs: dict[int, dict]) -> str:
    by_world = {w: {row["size_bytes"]: row["busbw_gbps"] for row in runs[w]["allreduce"]}
                for w in WORLD_SIZES if runs.get(w, {}).get("allreduce")}
    peaks = {w: max(sizes.values()) for w, sizes in by_world.items()}
    rows = [[f"{size / 2**20:g}", *(cell for w, sizes in by_world.items() for cell in (
        (f"{sizes[size]:.1f}", f"{sizes[size] / peaks[w]:.0%}") if size in sizes
        else ("-", "-")))] for size in sorted({s for sizes in by_world.values() for s in sizes})]
    headers = ["MiB", *(h for w in by_world for h in (f"busbw {w} GPUs GB/s", "of peak"))]
    peak_text = ", ".join(f"{peak:.1f} GB/s at {w} GPUs" for w, peak in peaks.items())
    return (markdown_table(headers, rows) + "\n\nPeak: the largest bus bandwidth measured at "
            f"that world size ({peak_text}); busbw = size / time x 2 (N - 1) / N, float32, "
            "median over iterations of the slowest rank.\n") if rows else ""


def _scaling_table(runs: dict[int, dict]) -> str:
    rows = []
    for name in dict.fromkeys(n for w in sorted(runs) for n in runs[w]["summary"]):
        of = {w: runs.get(w, {"summary": {}})["summary"].get(name, {}) for w in WORLD_SIZES}
        tokens = {w: of[w].get("tokens_per_s") for w in WORLD_SIZES}
        rows.append([name, *(fmt(of[w].get("step_s"), ".1f", 1e3) for w in WORLD_SIZES),
                     *(fmt(tokens[w], ".0f") for w in WORLD_SIZES),
                     *(fmt(None if None in (tokens[1], tokens[w]) else tokens[w]
                           / (w * tokens[1]), ".2f") for w in WORLD_SIZES[1:])])
    headers = ["variant", *(f"ms {w} GPU{'s' if w > 1 else ''}" for w in WORLD_SIZES),
               *(f"tokens/s {w}" for w in WORLD_SIZES),
               *(f"efficiency {w}" for w in WORLD_SIZES[1:])]
    return (markdown_table(headers, rows) + "\n\nWeak scaling (the same per-rank batch): "
            "tokens/s = GPUs x batch x sequence / step; efficiency = tokens/s at N GPUs / "
            "(N x the same variant's tokens/s at 1 GPU).\n")


def _in_turn_table(runs: dict[int, dict]) -> str:
    def ratios(run: dict, name: str, against: str | None) -> str:  # one per round
        return " / ".join(f"{r[name]['step_s'] / r[against]['step_s']:.3f}" for r in run["rounds"]
                          if "step_s" in r.get(name, {}) and "step_s" in r.get(against, {})) or "-"

    def spread(run: dict, name: str) -> str:  # of the least steady round: how far to trust
        spreads = [max(steps) / min(steps) - 1 for r in run["rounds"]
                   if (steps := r.get(name, {}).get("steps_s"))]
        return f"{max(spreads):.0%}" if spreads else "-"

    worlds = [w for w in WORLD_SIZES[1:] if w in runs]
    rows = [[name, *(cell for w in worlds for cell in (
        "-" if name == "none" else ratios(runs[w], name, "none"),
        ratios(runs[w], name, next((r for p, r in RIVALS.items() if name.startswith(p)), None)),
        spread(runs[w], name)))]
        for name in dict.fromkeys(n for w in worlds for n in runs[w]["summary"])]
    headers = ["variant", *(h for w in worlds
                            for h in (f"vs none, {w} GPUs", f"vs torch rival, {w} GPUs",
                                      f"spread, {w} GPUs"))]
    return (markdown_table(headers, rows) + "\n\nEach ratio: one ratio of medians per round "
            "(both from that round); the rival of bucketed is torch DDP, of fsdp torch FSDP2. "
            "Spread: the largest of the rounds' slowest timed step over their fastest, minus "
            "one: how steady the variant's steps were within a round.\n") if rows else ""


def dp_scaling(repo: Path, folder: str) -> str:
    """The tables from `folder/world{1,2,4}.json`, or a line saying none is measured yet."""
    runs = {w: read_source(repo, f"{folder}/world{w}.json", "dp_scaling study run")
            for w in WORLD_SIZES if (repo / f"{folder}/world{w}.json").is_file()}
    if not runs:
        return (f"Not measured yet: no `{folder}/world{{1,2,4}}.json` (run "
                "`studies/dp_scaling/run_4gpu.sh` on a 4-GPU machine).\n")
    first = runs[min(runs)]
    config = first["config"]
    parts = [part for part in (_busbw_table(runs), _scaling_table(runs), _in_turn_table(runs))
             if part]
    missing = [w for w in WORLD_SIZES if w not in runs]
    files = ", ".join(f"`{folder}/world{w}.json`" for w in sorted(runs))
    commits = sorted({str(run.get("commit")) for run in runs.values()})
    source = (f"Workload: {config['size']} {config['precision']}, per-rank batch "
              f"{config['batch_per_rank']} x ctx {config['seq_len']}, bucket "
              f"{config['bucket_size_mb']:g} MiB; {config['steps']} timed steps after "
              f"{config['warmup']} per variant per round. Time: {first['time']}; steps are "
              f"medians over rounds. GPU: {first['machine'].get('device_name')}. From "
              f"{files} (commit {', '.join(commits)})"
              + (f"; not measured yet at {', '.join(map(str, missing))} GPU(s)" if missing
                 else "") + ".\n")
    return "\n".join([*parts, source])


def generators(repo: Path) -> dict[str, Generator]:
    """Every generator by the name a doc's block uses, reading sources under `repo`."""
    return {
        "attention-dispatch-table": dispatch_table,
        "gate-constants": gate_constants,
        "gate-tallies": partial(gate_tallies, repo),
        "gate-cases": partial(gate_cases, repo),
        "drift": partial(drift.drift_block, repo),
        "breakdowns": partial(breakdown_side_by_side, repo),
        "headline": partial(claims.headline, repo),
        "accounting-memory": doc_accounting.config_memory_table,
        "accounting-checkpointing": doc_accounting.checkpointing_table,
        "accounting-xxl": doc_accounting.xxl_table,
        "accounting-communication": doc_accounting.communication_table,
        "dp-scaling": partial(dp_scaling, repo),
        "ratios": partial(timings.ratios, repo),
        "history": partial(timings.history, repo),
    }
