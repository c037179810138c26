"""Generated doc block of claims (`tools.docgen.claims`) from one saved run file: a headline
line for one topic, ours against its rivals."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from systems.runs.history import Run, load_run
from tools.docgen.claims import all_claims, ddp_claims, ratio_text, topic

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


def headline(repo: Path, history_name: str, ours: str, *rivals: str) -> str:
    """One line: ours / each rival in `history_name`, median (lowest–highest) over the
    workloads where both ran, with the topic, GPU, kind of time and source. Where ours met
    the rivals under several kinds of time, the one of most claims common to all rivals is
    taken. A data-parallel rival (say `none`) is set against the variant `ours` names (its
    first word)."""
    run = _load(repo, history_name)
    claims = [*all_claims(run.results),
              *(c for rival in rivals for c in ddp_claims(run.results, {ours.split()[0]: rival}))]
    by_rival = {rival: list({(c.group, c.ours.time_kind): c for c in claims
                             if c.ours.name == ours and c.rival.name == rival}.values())
                for rival in rivals}
    if missing := [rival for rival, found in by_rival.items() if not found]:
        raise ValueError(f"{history_name}: no claim of {ours} against {', '.join(missing)}")
    kinds = Counter(c.ours.time_kind for found in by_rival.values() for c in found)
    common = [k for k, _ in kinds.most_common()
              if all(any(c.ours.time_kind == k for c in found) for found in by_rival.values())]
    if not common:
        raise ValueError(f"{history_name}: no kind of time common to {ours}'s rivals")
    chosen = {rival: [c for c in found if c.ours.time_kind == common[0]]
              for rival, found in by_rival.items()}
    workloads = max(len(found) for found in chosen.values())
    first = next(iter(chosen.values()))[0]
    parts = [f"{RIVAL_LABELS.get(rival, rival)} {ratio_text(found)}"
             for rival, found in chosen.items()]
    where = first.group if workloads == 1 else f"{workloads} workloads"
    return (f"- **{topic(first).capitalize()}** on {run.device}, "
            f"{common[0]}: ours ({ours}) / {', / '.join(parts)} ({where}; below 1 ours "
            f"takes less time; `{history_name}`, {run.datetime[:10]}).\n")
