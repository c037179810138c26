"""Plot all-reduce bus bandwidth against size, one line per backend and world size.

`python -m systems.distributed.allreduce_plot OUT.png HISTORY.json ...` reads the
`test_allreduce` cases of pytest-benchmark histories.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def allreduce_points(paths: list[Path]) -> dict[str, list[tuple[int, float]]]:
    """(size in bytes, bus GB/s) per 'backend, world N' from saved benchmark JSON."""
    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in paths:
        for bench in json.loads(path.read_text())["benchmarks"]:
            info = bench["extra_info"]
            if bench["name"].startswith("test_allreduce") and "busbw_gbps" in info:
                label = f"{info['backend']}, world {info['world_size']}"
                lines[label].append((info["size_bytes"], info["busbw_gbps"]))
    return {label: sorted(points) for label, points in lines.items()}


def plot_allreduce(paths: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in sorted(allreduce_points(paths).items()):
        sizes, busbw = zip(*points, strict=True)
        ax.plot([s / 1e6 for s in sizes], busbw, marker="o", label=label)
    ax.set(xscale="log", xlabel="size (MB, float32)", ylabel="bus bandwidth (GB/s)",
           title="all-reduce, max over ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    plot_allreduce([Path(p) for p in sys.argv[2:]], Path(sys.argv[1]))
