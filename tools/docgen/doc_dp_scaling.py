"""The `dp-scaling` block, from studies/dp_scaling/study.py's `<folder>/world{1,2,4}.json`:
all-reduce bus bandwidth by message size, each variant's step, tokens/s and scaling
efficiency, and each variant against no communication (and its torch rival) per round."""

from __future__ import annotations

from pathlib import Path

from systems.common.formatting import fmt, markdown_table
from tools.docgen.doc_blocks import read_source

WORLD_SIZES = (1, 2, 4)
# Each of our variants against the torch implementation it must beat.
RIVALS = {"bucketed": "torch_ddp", "fsdp": "torch_fsdp2"}


def _busbw_table(runs: dict[int, dict]) -> str:
    measured = [w for w in WORLD_SIZES if runs.get(w, {}).get("allreduce")]
    if not measured:
        return ""
    by_world = {w: {row["size_bytes"]: row["busbw_gbps"] for row in runs[w]["allreduce"]}
                for w in measured}
    peaks = {w: max(by_world[w].values()) for w in measured}
    rows = [[f"{size / 2**20:g}", *(cell for w in measured for cell in (
        ("-", "-") if size not in by_world[w]
        else (f"{by_world[w][size]:.1f}", f"{by_world[w][size] / peaks[w]:.0%}")))]
        for size in sorted({size for rows in by_world.values() for size in rows})]
    headers = ["MiB", *(h for w in measured for h in (f"busbw {w} GPUs GB/s", "of peak"))]
    peak_text = ", ".join(f"{peaks[w]:.1f} GB/s at {w} GPUs" for w in measured)
    return (markdown_table(headers, rows) + "\n\nPeak: the largest bus bandwidth measured at "
            f"that world size ({peak_text}); busbw = size / time x 2 (N - 1) / N, float32, "
            "median over iterations of the slowest rank.\n")


def _scaling_table(runs: dict[int, dict]) -> str:
    rows = []
    for name in dict.fromkeys(n for w in sorted(runs) for n in runs[w]["summary"]):
        of = {w: runs[w]["summary"].get(name, {}) if w in runs else {} for w in WORLD_SIZES}
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


def _ratios(run: dict, name: str, against: str) -> str:
    pairs = [(r[name]["step_s"], r[against]["step_s"]) for r in run["rounds"]
             if "step_s" in r.get(name, {}) and "step_s" in r.get(against, {})]
    return " / ".join(f"{a / b:.3f}" for a, b in pairs) or "-"


def _spread(run: dict, name: str) -> str:
    """The largest spread of a variant's timed steps within one round (slowest / fastest
    - 1): the machine's steadiness, against which the ratios beside it are read."""
    spreads = [max(steps) / min(steps) - 1 for r in run["rounds"]
               if (steps := r.get(name, {}).get("steps_s"))]
    return f"{max(spreads):.0%}" if spreads else "-"


def _in_turn_table(runs: dict[int, dict]) -> str:
    worlds = [w for w in WORLD_SIZES[1:] if w in runs]
    if not worlds:
        return ""
    rows = []
    for name in dict.fromkeys(n for w in worlds for n in runs[w]["summary"]):
        rival = next((r for prefix, r in RIVALS.items() if name.startswith(prefix)), None)
        rows.append([name, *(cell for w in worlds for cell in (
            "-" if name == "none" else _ratios(runs[w], name, "none"),
            _ratios(runs[w], name, rival) if rival else "-", _spread(runs[w], name)))])
    headers = ["variant", *(h for w in worlds
                            for h in (f"vs none, {w} GPUs", f"vs torch rival, {w} GPUs",
                                      f"spread, {w} GPUs"))]
    return (markdown_table(headers, rows) + "\n\nEach ratio: one ratio of medians per round "
            "(both from that round); the rival of bucketed is torch DDP, of fsdp torch FSDP2. "
            "Spread: the largest of the rounds' slowest timed step over their fastest, minus "
            "one: how steady the variant's steps were within a round.\n")


def dp_scaling(repo: Path, folder: str) -> str:
    """The three tables from `folder/world{1,2,4}.json` (relative to `repo`); a line saying
    what is missing when none exists."""
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
