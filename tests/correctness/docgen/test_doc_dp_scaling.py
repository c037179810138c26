"""The data-parallel scaling block: rendered from the study's run files, and saying so
when there are none yet."""

from __future__ import annotations

import json
from pathlib import Path

from tools.docgen.doc_blocks import render
from tools.docgen.doc_sources import generators

BLOCK = "<!-- generated: dp-scaling runs -->\nold\n<!-- end generated -->\n"


def _run(world: int, steps: dict[str, list[float]], busbw: dict[int, float]) -> dict:
    """A study file: per variant one step (seconds) per round, bus bandwidth per size."""
    tokens = world * 8 * 128
    rounds = [{name: {"step_s": s[i], "sync_s": 0.0} for name, s in steps.items()}
              for i in range(2)]
    return {
        "study": "dp_scaling", "commit": "abc1234", "world_size": world,
        "machine": {"device_name": "NVIDIA H100 80GB HBM3"},
        "config": {"size": "xl", "batch_per_rank": 8, "seq_len": 128, "bucket_size_mb": 1000.0,
                   "warmup": 2, "steps": 5, "precision": "fp32"},
        "time": "CUDA-event step time of the slowest rank",
        "allreduce": [{"size_bytes": size, "seconds": 1.0, "busbw_gbps": value}
                      for size, value in busbw.items()],
        "rounds": rounds,
        "summary": {name: {"step_s": sorted(s)[0], "tokens_per_s": tokens / sorted(s)[0]}
                    for name, s in steps.items()},
    }


def _write(repo: Path, world: int, run: dict) -> None:
    (repo / "runs").mkdir(exist_ok=True)
    (repo / "runs" / f"world{world}.json").write_text(json.dumps(run))


def test_tables_from_the_runs(tmp_path: Path) -> None:
    _write(tmp_path, 1, _run(1, {"none": [0.4, 0.4], "bucketed": [0.4, 0.4]}, {}))
    _write(tmp_path, 2, _run(2, {"none": [0.4, 0.41], "torch_ddp": [0.44, 0.44],
                                 "bucketed": [0.404, 0.418]},
                             {2**20: 50.0, 2**30: 200.0}))
    out = render(BLOCK, generators(tmp_path))
    # bus bandwidth against the largest measured at that world size
    assert "| 1 | 50.0 | 25% |" in out and "| 1024 | 200.0 | 100% |" in out
    # 1 GPU: 0.4 s for 1024 tokens; 2 GPUs: 0.404 s for 2048: efficiency 0.4 / 0.404
    assert "| bucketed | 400.0 | 404.0 | - | 2560 | 5069 | - | 0.99 | - |" in out
    # per round, against none and against torch DDP, each ratio within one round
    assert "| bucketed | 1.010 / 1.020 | 0.918 / 0.950 |" in out
    assert "not measured yet at 4 GPU(s)" in out and "commit abc1234" in out
    assert render(out, generators(tmp_path)) == out  # rewriting is stable


def test_says_not_measured_yet_without_runs(tmp_path: Path) -> None:
    out = render(BLOCK, generators(tmp_path))
    assert "Not measured yet: no `runs/world{1,2,4}.json`" in out


def test_spread_is_the_least_steady_round(tmp_path: Path) -> None:
    run = _run(2, {"none": [0.4, 0.4], "fsdp": [0.44, 0.46]}, {})
    run["rounds"][0]["fsdp"]["steps_s"] = [0.44, 0.45, 0.484]  # 10% apart
    run["rounds"][1]["fsdp"]["steps_s"] = [0.46, 0.47, 0.483]  # 5% apart
    _write(tmp_path, 2, run)
    out = render(BLOCK, generators(tmp_path))
    # against none, against torch FSDP2 (not run: "-"), then the spread of the worst round
    assert "| fsdp | 1.100 / 1.150 | - | 10% |" in out
    assert "| none | - | - | - |" in out  # no per-step times recorded: no spread
