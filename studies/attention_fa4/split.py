"""The forward and the backward apart: ours (the default path), SDPA cuDNN and
FlashAttention-4 at the attention table's long shapes, device time in rounds taken in turn.

    PYTHONPATH=src python -m studies.attention_fa4.split --out OUT/split.json --commit SHA \
        --shape 1x16x16384x64 ...

The table's cases time forward + backward together; this says which of the two holds the
gap to FlashAttention-4. Per shape and round, each implementation's forward is timed with
do_bench, then its backward alone (autograd from one saved forward, the graph kept). A
ratio is the median of the per-round ratios to FlashAttention-4's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

from studies.harness import attention_shape, run_record
from systems.attention import get_attention

IMPLEMENTATIONS = ("triton", "sdpa_cudnn", "fa4")
ROUNDS = 5


def _passes(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(forward ms, backward ms) of one do_bench each, on fresh random inputs."""
    attend = get_attention(name)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return attend(q, k, v, is_causal=True)

    out = attend(q, k, v, is_causal=True)

    def backward() -> None:
        torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)

    return triton.testing.do_bench(forward), triton.testing.do_bench(backward)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="write the rows here (JSON)")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    parser.add_argument("--shape", type=attention_shape, action="append", required=True,
                        help="BxHxSxD (repeatable)")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for shape in args.shape:
        times = {name: {"forward": [], "backward": []} for name in IMPLEMENTATIONS}
        for _ in range(ROUNDS):
            for name in IMPLEMENTATIONS:
                forward_ms, backward_ms = _passes(name, shape)
                times[name]["forward"].append(forward_ms)
                times[name]["backward"].append(backward_ms)
        for name in IMPLEMENTATIONS:
            row = {"shape": list(shape), "implementation": name}
            for step, rounds in times[name].items():
                ratios = [a / b for a, b in zip(rounds, times["fa4"][step], strict=True)]
                row |= {f"{step}_ms": statistics.median(rounds), f"{step}_rounds_ms": rounds,
                        f"{step}_over_fa4": statistics.median(ratios),
                        f"{step}_over_fa4_range": [min(ratios), max(ratios)]}
            rows.append(row)
            print("x".join(map(str, shape)), f"{name:10}",
                  " ".join(f"{step} {row[f'{step}_ms']:.3f} ms ({row[f'{step}_over_fa4']:.3f}"
                           " of FA4)" for step in ("forward", "backward")), flush=True)
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run_record(args.commit, ROUNDS, rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
