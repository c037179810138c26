"""Whether running the optimizer beside backward pays: the optimized train step timed with
its AdamW updates after backward, and overlapped with backward (`overlap_optimizer`), with
the backward stream at the default priority or the highest (one CUDA GPU; each variant
built, timed and freed in turn).

The run of commit 7681130 also timed overlapped updates on a capped grid (16, 33 and 66
programs, a cap since removed): each program then streams its blocks one after another,
so the updates became slower than the whole backward they ran beside (see
studies/overlap_experiment/runs/).

Usage: PYTHONPATH=src python -m studies.overlap_experiment.study OUT.json [--size 2.7b]
       [--seq-len 512] [--steps 15]
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch

from systems.bench.timing import time_steps
from systems.bench.workloads import build_recipe_workload
from systems.common.hardware import machine_description
from systems.model import get_config
from systems.model.recipes import get_recipe
from systems.model.train_step import CUDA_GRAPH_WARMUP

# name: (recipe overrides, backward stream raised above the updates' stream)
_OVERLAPPED = {"compile_scope": "blocks", "overlap_optimizer": True}
VARIANTS: dict[str, tuple[dict[str, object], bool]] = {
    "after_backward": ({}, False),
    "after_backward_blocks": ({"compile_scope": "blocks"}, False),
    "overlapped": (_OVERLAPPED, False),
    "overlapped_backward_first": (_OVERLAPPED, True),
}


def _time(config, seq_len: int, steps: int, overrides: dict[str, object],
          backward_first: bool) -> dict[str, float]:
    workload = build_recipe_workload(config, get_recipe("optimized", **overrides),
                                     seq_len=seq_len, device="cuda")
    if backward_first:  # the stream the step is captured on, before its first call
        _, highest = torch.cuda.Stream.priority_range()
        workload.step.stream = torch.cuda.Stream(priority=highest)
    torch.cuda.reset_peak_memory_stats()
    stats = time_steps(workload.step, warmup=CUDA_GRAPH_WARMUP + 1, steps=steps,
                       device="cuda")
    result = {"median_ms": stats.median * 1e3, "min_ms": min(stats.times) * 1e3,
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del workload
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="2.7b")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--only", nargs="*", choices=sorted(VARIANTS))
    args = parser.parse_args()
    config = get_config(args.size)
    results = {}
    for name in args.only or VARIANTS:
        results[name] = _time(config, args.seq_len, args.steps, *VARIANTS[name])
        print(f"{name:45s} {results[name]['median_ms']:8.2f} ms", flush=True)
        args.out.write_text(json.dumps({"machine": machine_description(), "size": args.size,
                                        "seq_len": args.seq_len, "results": results},
                                       indent=1))


if __name__ == "__main__":
    main()
