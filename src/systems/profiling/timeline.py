"""Read a CUDA memory snapshot (`torch.cuda.memory._snapshot()`): the active-memory timeline,
its peak, and the largest allocations with the code that made them; render it to PNG."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

_TORCH_INTERNALS = ("torch/", "contextlib.py", "<frozen", "site-packages/")


@dataclass(frozen=True)
class Timeline:
    """Active (allocated, not yet freed) bytes after each trace event."""

    times_ms: list[float]
    active_bytes: list[int]
    time_is_wall_clock: bool

    @property
    def peak_bytes(self) -> int:
        return max(self.active_bytes, default=0)


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces", [])
    return traces[device] if device < len(traces) else []


def active_at_snapshot(snapshot: dict) -> int:
    """Bytes in blocks still allocated (or awaiting a stream's free) when it was taken."""
    return sum(block["size"] for segment in snapshot.get("segments", [])
               for block in segment.get("blocks", [])
               if block.get("state", "").startswith("active"))


def active_timeline(snapshot: dict, device: int = 0) -> Timeline:
    """Replay alloc / free_completed events from the memory present before recording began.

    That starting level is what the snapshot holds at the end minus the net change the
    trace records (allocations made before recording never appear in the trace).
    """
    events = _trace(snapshot, device)
    deltas = [_delta(e) for e in events]
    level = active_at_snapshot(snapshot) - sum(deltas)
    active = []
    for delta in deltas:
        level += delta
        active.append(level)
    wall_clock = bool(events) and all("time_us" in e for e in events)
    if wall_clock:
        start = events[0]["time_us"]
        times = [(e["time_us"] - start) / 1e3 for e in events]
    else:
        times = [float(i) for i in range(len(events))]
    return Timeline(times, active, wall_clock)


def _delta(event: dict) -> int:
    if event["action"] == "alloc":
        return event["size"]
    if event["action"] == "free_completed":
        return -event["size"]
    return 0


@dataclass(frozen=True)
class Allocation:
    """Allocations of one size made at one place in the code."""

    size: int
    count: int
    where: str


def largest_allocations(snapshot: dict, top: int = 10, device: int = 0) -> list[Allocation]:
    """The `top` largest allocation sizes in the trace, grouped by the code that made them."""
    counts = Counter((e["size"], allocation_site(e.get("frames", [])))
                     for e in _trace(snapshot, device) if e["action"] == "alloc")
    ranked = sorted(counts.items(), key=lambda item: (-item[0][0], -item[1]))
    return [Allocation(size, count, where) for (size, where), count in ranked[:top]]


def allocation_site(frames: list[dict]) -> str:
    """'file.py:line in function' of the innermost frame in this package, else the innermost
    outside torch and the stdlib."""
    ours = [f for f in frames if "/systems/" in f.get("filename", "")]
    others = [f for f in frames
              if not any(part in f.get("filename", "") for part in _TORCH_INTERNALS)]
    for frame in ours[:1] or others[:1]:
        short = "/".join(Path(frame["filename"]).parts[-3:])
        return f"{short}:{frame.get('line')} in {frame.get('name')}"
    return "(no user frame recorded)"


def plot_timeline(timeline: Timeline, title: str, path: Path) -> Path:
    """Active memory (GiB) against time (ms) or event index, peak marked; written as PNG."""
    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    gib = [b / 2**30 for b in timeline.active_bytes]
    ax.fill_between(timeline.times_ms, gib, step="post", alpha=0.35, color="tab:blue")
    ax.step(timeline.times_ms, gib, where="post", color="tab:blue", linewidth=0.8)
    if gib:
        peak_at = gib.index(max(gib))
        ax.axhline(max(gib), color="tab:red", linestyle="--", linewidth=0.8)
        ax.annotate(f"peak {max(gib):.2f} GiB", (timeline.times_ms[peak_at], max(gib)),
                    textcoords="offset points", xytext=(5, -12), color="tab:red")
    ax.set_xlabel("time since recording began (ms)" if timeline.time_is_wall_clock
                  else "allocator event index")
    ax.set_ylabel("active memory (GiB)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
