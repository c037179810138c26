"""Generated doc block of train-step breakdowns (`systems profile breakdown`'s JSON) side
by side: kernel time per category beside its floor."""

from __future__ import annotations

from pathlib import Path

from systems.common.formatting import markdown_table
from tools.docgen.doc_blocks import read_source


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


