"""The fused AdamW kernel's tile (BLOCK_SIZE, num_warps), timed on one CUDA GPU.

    PYTHONPATH=src python -m studies.adamw_kernel_tune.study [--million-params 512] [--json OUT]

For bf16 parameters over split masters (int16 low bits, the optimized recipe's layout)
and over fp32 masters, times one step of `launch_fused_adamw_` over matrices of the 2.7b
model's shapes with each candidate tile (`triton.testing.do_bench`, median ms), beside
the bytes the step must move at the GPU's copy bandwidth (a 1 GiB same-device copy,
best of five). Every tile must compute the default tile's bits: each first runs one step
from the same state and is compared with it bit for bit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton.testing

from systems.optim.adamw_kernel import BLOCK_SIZE, NUM_WARPS, launch_fused_adamw_
from systems.optim.split_master import split_master
from systems.profiling.step_breakdown import adamw_bytes_per_weight, measure_copy_bandwidth

CANDIDATES = ((4096, 4), (4096, 8), (2048, 4), (2048, 8), (1024, 4))
MATRIX = (2560, 10240)  # the 2.7b model's feed-forward weight
HYPER = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def state(million_params: int, split: bool, device: torch.device) -> list[list[torch.Tensor]]:
    """params, grads, masters, exp_avgs, exp_avg_sqs: fresh random values, never zeros."""
    count = max(1, million_params * 10**6 // (MATRIX[0] * MATRIX[1]))
    gen = torch.Generator(device).manual_seed(0)

    def randn() -> torch.Tensor:
        return torch.randn(MATRIX, generator=gen, device=device)

    masters = [randn() for _ in range(count)]
    if split:
        halves = [split_master(m) for m in masters]
        params, masters = [p for p, _ in halves], [low for _, low in halves]
    else:
        params = [m.to(torch.bfloat16) for m in masters]
    grads = [randn().to(torch.bfloat16) for _ in range(count)]
    return [params, grads, masters, [randn() for _ in range(count)],
            [randn().abs() for _ in range(count)]]


def step(tensors: list[list[torch.Tensor]], block_size: int, num_warps: int) -> None:
    steps = torch.full((len(tensors[0]),), 2.0, dtype=torch.float64, device=tensors[0][0].device)
    launch_fused_adamw_(*tensors, steps=steps, block_size=block_size, num_warps=num_warps,
                        **HYPER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--million-params", type=int, default=512)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_bytes_per_s = measure_copy_bandwidth(device)
    rows = []
    for split in (True, False):
        fresh = state(args.million_params, split, device)
        expected = [[t.clone() for t in group] for group in fresh]
        step(expected, BLOCK_SIZE, NUM_WARPS)
        weights = sum(p.numel() for p in fresh[0])
        moved = weights * adamw_bytes_per_weight(torch.bfloat16.itemsize,
                                                 "split" if split else "fp32")
        for block_size, num_warps in CANDIDATES:
            tensors = [[t.clone() for t in group] for group in fresh]
            step(tensors, block_size, num_warps)
            same = all(torch.equal(a, b) for got, want in zip(tensors, expected, strict=True)
                       for a, b in zip(got, want, strict=True))
            ms = triton.testing.do_bench(lambda t=tensors, b=block_size, w=num_warps:
                                         step(t, b, w))
            rows.append({"masters": "split" if split else "fp32", "block_size": block_size,
                         "num_warps": num_warps, "ms": ms, "same_bits": same,
                         "floor_ms": moved / copy_bytes_per_s * 1e3,
                         "million_params": weights / 1e6})
            print(f"{rows[-1]['masters']:5} masters  block {block_size:5} warps {num_warps}: "
                  f"{ms:7.3f} ms  (floor {rows[-1]['floor_ms']:.3f} ms, "
                  f"{'same bits' if same else 'BITS DIFFER'})", flush=True)
        del fresh, expected
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                         "copy_gbps": copy_bytes_per_s / 1e9, "rows": rows},
                                        indent=1))
    if not all(row["same_bits"] for row in rows):
        raise SystemExit("a tile computed other bits than the default one")


if __name__ == "__main__":
    main()
