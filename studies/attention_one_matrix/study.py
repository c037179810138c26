"""How the ordered Gluon backward should walk one long matrix: the launch order and tile
order of its key blocks (`gluon.backward.SCHEDULES`) and the number of dQ accumulator
chains (`GluonConfig.chains`), one GPU, bf16, causal.

For each (matrices, seq, d) it runs the ordered backward with the multi-matrix schedule
(alternating) on 1, 2 and 4 chains, descending on 1, 2, 4 and 8, and the library's pick,
beside the
unordered backward (the floor an order costs against) and SDPA cuDNN's backward. Each
ordered variant's gradients must match the unordered one's within bf16 rounding and repeat
bit for bit; then each is timed in rounds taken in turn (device time, do_bench medians;
the backward's host work is hidden behind kernels this long). Writes DIR/one_matrix.json,
which `make report` tabulates in the study's README.

Usage: PYTHONPATH=src python -m studies.attention_one_matrix.study --out DIR --commit HASH
       [--shape MATRICES,SEQ,D ...]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from studies.harness import max_abs, measure_shapes, run_record
from systems.attention.flash_triton import flash_forward
from systems.attention.gluon.backward import CONFIGS, HEAD_DIMS, GluonConfig, gluon_backward
from systems.bench.timing import interleaved_device_time

ROUNDS = 5
# One matrix at the lengths where its key blocks outnumber an H100's SMs, and a few
# matrices of the same sizes as controls.
SHAPES = ((1, 16384, 64), (1, 32768, 64), (1, 65536, 64), (1, 16384, 128), (1, 32768, 128),
          (1, 65536, 128), (2, 32768, 64), (4, 16384, 64), (2, 16384, 128),
          # and the attention table's long shapes, many matrices filling the GPU
          (16, 16384, 64), (16, 16384, 128), (64, 4096, 64), (64, 4096, 128))
CHAINS = (1, 2, 4, 8)
ALTERNATING_CHAINS = (2, 4)
# Largest distance from the unordered gradients allowed, in units of bf16's epsilon
# times the gradient's largest magnitude: both add the same fp32 shares in other orders.
SLACK_EPS = 4
Step = Callable[[], object]


def variants(head_dim: int) -> dict[str, GluonConfig | None]:
    """Each ordered config timed, by name; None is the library's pick."""
    alternating = CONFIGS[head_dim, True]
    found: dict[str, GluonConfig | None] = {"library": None, "alternating": alternating}
    found |= {f"alternating, {n} chains": replace(alternating, chains=n)
              for n in ALTERNATING_CHAINS}
    found |= {f"descending, {n} chain{'s' * (n > 1)}":
              replace(alternating, schedule="descending", chains=n) for n in CHAINS}
    return found


def agrees(grads: tuple[torch.Tensor, ...], floor: tuple[torch.Tensor, ...]) -> bool:
    eps = torch.finfo(torch.bfloat16).eps
    return all(max_abs(a, b) <= SLACK_EPS * eps * b.abs().max().item()
               for a, b in zip(grads, floor, strict=True))


def measure(shape: tuple[int, int, int]) -> dict[str, object]:
    matrices, seq, d = shape
    generator = torch.Generator(device="cuda").manual_seed(seq + d)
    q, k, v, do = (torch.randn(1, matrices, seq, d, device="cuda", dtype=torch.bfloat16,
                               generator=generator) for _ in range(4))
    o, lse = flash_forward(q, k, v, True)
    steps: dict[str, Step] = {"unordered": functools.partial(
        gluon_backward, q, k, v, o, lse, do, True, deterministic=False)}
    unordered = steps["unordered"]()
    wrong = []
    for name, config in variants(d).items():
        step = functools.partial(gluon_backward, q, k, v, o, lse, do, True, config=config)
        first, again = step(), step()
        if not (agrees(first, unordered) and all(map(torch.equal, first, again))):
            wrong.append(name)
        steps[name] = step
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    steps["SDPA cuDNN"] = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)
    seconds = interleaved_device_time(steps, rounds=ROUNDS)
    ms = {name: [s * 1e3 for s in rounds] for name, rounds in seconds.items()}
    return {"shape": list(shape), "wrong": wrong, "ms_per_round": ms}


def summary(row: dict[str, object]) -> str:
    medians = {n: statistics.median(t) for n, t in row["ms_per_round"].items()}
    return (f"{'x'.join(map(str, row['shape']))}: "
            + ", ".join(f"{n} {m:.3f}" for n, m in medians.items())
            + (f"; WRONG {row['wrong']}" if row["wrong"] else ""))


def shape_arg(text: str) -> tuple[int, int, int]:
    try:
        matrices, seq, d = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MATRICES,SEQ,D") from None
    if min(matrices, seq) < 1 or d not in HEAD_DIMS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: matrices and seq must be positive and d one of {HEAD_DIMS}")
    return matrices, seq, d


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write DIR/one_matrix.json")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    parser.add_argument("--shape", action="append", type=shape_arg,
                        help="time only this MATRICES,SEQ,D (repeatable; all of SHAPES by "
                             "default)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("needs an sm_90 GPU (H100, H200)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure_shapes(args.shape or SHAPES, measure, run_record(args.commit, ROUNDS, []),
                          args.out / "one_matrix.json", summary)
    return 0 if not any(row["wrong"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
