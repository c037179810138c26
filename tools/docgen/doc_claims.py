"""Generated doc block of claims (`tools.docgen.claims`) from one saved run file: a headline
line for one topic, ours against its rivals."""

from __future__ import annotations

import statistics
from pathlib import Path

from systems.runs.history import Run, load_run
from tools.docgen.claims import Claim, all_claims, ddp_claims, topic

# The names a reader knows the rivals by.
RIVAL_LABELS = {"sdpa_cudnn": "cuDNN (SDPA)", "sdpa_flash": "SDPA flash",
                "flex_compiled": "compiled flex_attention", "fa4": "FlashAttention-4",
                "pytorch_baseline": "PyTorch compiled in one CUDA graph",
                "none": "no communication", "torch_ddp": "torch DDP",
                "torch_fsdp2": "torch FSDP2"}


def _load(repo: Path, history_name: str) -> Run:
    path = repo / history_name
    if not path.is_file():
        raise ValueError(f"{history_name}: no such history file")
    return load_run(path, path.parent)


def _ratio_text(claims: list[Claim]) -> str:
    ratios = sorted(c.ratio for c in claims)
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}"
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})"


def headline(repo: Path, history_name: str, ours: str, *rivals: str) -> str:
    """One line: ours / each rival in `history_name`, median (lowest–highest) over the
    workloads where both ran, with the topic, GPU, kind of time and source. Every rival
    must be measured with one kind of time. A data-parallel rival (say `none`) is set
    against the variant `ours` names (its first word)."""
    run = _load(repo, history_name)
    claims = [*all_claims(run.results),
              *(c for rival in rivals for c in ddp_claims(run.results, {ours.split()[0]: rival}))]
    parts, kinds, workloads = [], set(), 0
    for rival in rivals:
        found = list({(c.group, c.rival.name): c for c in claims
                      if c.ours.name == ours and c.rival.name == rival}.values())
        if not found:
            raise ValueError(f"{history_name}: no claim of {ours} against {rival}")
        kinds |= {c.ours.time_kind for c in found}
        workloads = max(workloads, len(found))
        parts.append(f"{RIVAL_LABELS.get(rival, rival)} {_ratio_text(found)}")
    if len(kinds) != 1:
        raise ValueError(f"{history_name}: {ours}'s claims mix kinds of time: {sorted(kinds)}")
    where = found[0].group if workloads == 1 else f"{workloads} workloads"
    return (f"- **{topic(found[0]).capitalize()}** on {run.device}, "
            f"{kinds.pop()}: ours ({ours}) / {', / '.join(parts)} ({where}; below 1 ours "
            f"takes less time; `{history_name}`, {run.datetime[:10]}).\n")
