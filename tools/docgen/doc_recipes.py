"""Generated doc blocks for the training recipes: ours against the strongest PyTorch-only
step in one saved run, a recipe's step with other attention than its own, and step
breakdowns side by side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from systems.common.formatting import markdown_table
from systems.model.config import MODEL_CONFIGS
from systems.model.recipes import RECIPES
from systems.profiling.step_breakdown import DEFAULT_MATMUL_TFLOPS
from systems.runs import keys
from systems.runs.history import Result, load_run, read_run
from tools.docgen.doc_blocks import read_source


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


OURS, RIVAL = "optimized", "pytorch_baseline"


def recipe_ratios(repo: Path, *history_names: str) -> str:
    """Per size and sequence length: both recipes' median step, ours / theirs, and our
    model FLOP rate beside the bf16 matmul ceiling. Several files (runs of parts of a
    profile, say) give one table; each ratio is of two medians from one file."""
    if not history_names:
        raise ValueError("recipe-ratios needs at least one history file")
    histories = [read_history(repo, name) for name in history_names]
    # Several files: a first column names each row's file (its stem), in the order given.
    several = len(histories) > 1
    rows = [([Path(history.label).stem] if several else []) + row
            for history in histories for row in _ratio_rows(history)]
    table = markdown_table(
        (["run"] if several else [])
        + ["size", "seq len", f"{RIVAL} ms", f"{OURS} ms", "ours / theirs", "our TFLOP/s",
           f"of {DEFAULT_MATMUL_TFLOPS:.0f} TFLOP/s"], rows)
    time_kind = "CUDA-graph replays, device time plus one synchronise per round"
    statistic = "medians of all rounds, ratios of medians; model FLOPs per step over the median"
    if len(histories) == 1:
        return table + "\n\n" + histories[0].source(time_kind, statistic)
    files = ", ".join(f"`{h.label}` (commit {h.commit}, recorded {h.recorded})"
                      for h in histories)
    return (f"{table}\n\nTime: {time_kind}; {statistic}; both medians of a ratio from one "
            f"file. From {files}.\n")


def _workload(r: Result) -> tuple[str, int]:
    return str(r.get(keys.SIZE)), int(r.get(keys.SEQ_LEN) or 0)


def _by_size(workload: tuple[str, int]) -> tuple[int, int]:
    """Sort key: model sizes smallest first, then sequence length."""
    order = list(MODEL_CONFIGS)
    size, seq_len = workload
    return order.index(size) if size in order else len(order), seq_len


def _own_attention(r: Result) -> bool:
    """Whether a recipe's row ran the recipe's own attention (files saved before rows named
    theirs did)."""
    attention = r.get(keys.ATTENTION)
    return attention is None or attention == RECIPES[str(r.get(keys.RECIPE))].attention


def _ratio_rows(history: History) -> list[list[object]]:
    pairs: dict[tuple[str, int], dict[str, object]] = {}
    for r in history.results:
        if r.get(keys.RECIPE) in (OURS, RIVAL) and _own_attention(r):
            pairs.setdefault(_workload(r), {})[str(r.get(keys.RECIPE))] = r
    rows = []
    for (size, seq_len), pair in sorted(pairs.items(), key=lambda kv: _by_size(kv[0])):
        if OURS not in pair or RIVAL not in pair:
            continue
        ours, rival = pair[OURS], pair[RIVAL]
        ratio = ours.median / rival.median
        flops = ours.get("flops")
        tflops = flops / ours.median / 1e12 if isinstance(flops, int | float) else None
        rows.append([size, seq_len, f"{rival.median * 1e3:.1f}", f"{ours.median * 1e3:.1f}",
                     f"{ratio:.3f}",
                     "-" if tflops is None else f"{tflops:.0f}",
                     "-" if tflops is None else f"{tflops / DEFAULT_MATMUL_TFLOPS:.1%}"])
    if not rows:
        raise ValueError(f"{history.label}: no size and sequence length with both the "
                         f"{OURS} and the {RIVAL} recipe")
    return rows


def recipe_attention(repo: Path, history_name: str) -> str:
    """A recipe's step timed with attention other than its own, beside its own, from one
    file: each attention's median and its ratio to the recipe's own."""
    history = read_history(repo, history_name)
    groups: dict[tuple[str, int, str], dict[str, Result]] = {}
    for r in history.results:
        recipe, attention = r.get(keys.RECIPE), r.get(keys.ATTENTION)
        if recipe in RECIPES and attention is not None:
            groups.setdefault((*_workload(r), str(recipe)), {})[str(attention)] = r
    rows = []
    for (size, seq_len, recipe), steps in sorted(groups.items(),
                                                 key=lambda kv: _by_size(kv[0][:2])):
        own = RECIPES[recipe].attention
        if own not in steps or len(steps) < 2:
            continue
        for attention in sorted(steps, key=lambda name: (name != own, name)):
            step = steps[attention]
            rows.append([size, seq_len, recipe, f"`{attention}`" + (" (its own)" if
                                                                   attention == own else ""),
                         f"{step.median * 1e3:.1f}",
                         f"{step.stats['min'] * 1e3:.1f}–{step.stats['max'] * 1e3:.1f}",
                         f"{step.median / steps[own].median:.3f}"])
    if not rows:
        raise ValueError(f"{history.label}: no recipe timed with attention other than its own")
    table = markdown_table(["size", "seq len", "recipe", "attention", "step ms",
                            "rounds ms", "/ its own attention's"], rows)
    return table + "\n\n" + history.source(
        "CUDA-graph replays, device time plus one synchronise per round",
        "medians and ranges of all rounds, ratios of medians")


def breakdown_side_by_side(repo: Path, *files: str) -> str:
    """Kernel time per step by category, one column per breakdown file, and the floors
    of the first file's workload."""
    if not files:
        raise ValueError("name at least one breakdown file")
    records = [read_source(repo, name, "breakdown record") for name in files]
    categories = [row["category"] for row in records[0]["rows"]]
    by_file = [{row["category"]: row for row in record["rows"]} for record in records]

    def cell(row: dict | None, key: str) -> str:
        value = None if row is None else row.get(key)
        return "-" if value is None else f"{value:.1f}"

    rows = [[category, *(cell(rows.get(category), "ms") for rows in by_file),
             cell(by_file[0].get(category), "floor_ms")] for category in categories]
    rows.append(["step (unprofiled)",
                 *(f"{record['unprofiled_wall_ms']:.1f}" for record in records), "-"])
    headers = ["category", *(f"{record['recipe']} ms ({Path(name).stem})"
                             for record, name in zip(records, files, strict=True)),
               "floor ms"]
    machines = sorted({f"{r.get('machine')}, {r.get('measured')}, {r.get('steps')} steps"
                       for r in records})
    listed = ", ".join(f"`{name}`" for name in files)
    commits = [record.get("commit") for record in records]
    recorded = ("commits " + ", ".join(c or "not recorded" for c in commits) if any(commits)
                else "the files record no commit")
    return (markdown_table(headers, rows) + "\n\nTime: GPU kernel time per step by "
            f"category (torch.profiler). From {listed} ({'; '.join(machines)}; "
            f"{recorded}).\n")


