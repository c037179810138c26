"""Generated doc block for the README: one row per comparison of ours with a rival, from
the claims of one saved run file (`tools.docgen.claims`)."""

from __future__ import annotations

from pathlib import Path

from systems.runs.history import load_run
from tools.docgen.claims import all_claims, summary_table


def claims_summary(repo: Path, history_name: str) -> str:
    """The claims of `history_name` (relative to the repository), one row per comparison
    and kind of time, with the GPU and the file they come from."""
    path = repo / history_name
    if not path.is_file():
        raise ValueError(f"{history_name}: no such history file")
    run = load_run(path, path.parent)
    claims = all_claims(run.results)
    if not claims:
        raise ValueError(f"{history_name}: no comparison of ours with a rival")
    table = summary_table(claims).splitlines()
    # The file column repeats the one source named below: leave it out.
    rows = ["|".join(line.split("|")[:-2]) + "|" for line in table]
    return ("\n".join(rows) + f"\n\nGPU: {run.device}. Ratios of medians of ours and the "
            "rival measured in the same run, below 1: ours takes less time. "
            f"From `{history_name}` (recorded {run.datetime[:10]}).\n")
