"""Which of our kernel pairs is fastest per shape, and the dispatch table that follows
(`systems.attention.dispatch.TABLE`): one sm_90 GPU, bf16, causal, forward + backward.

Over a grid of lengths (512 to 16384), head dims (64, 80, 96, 128) and two numbers of
tokens (batch x heads x seq: a few query tiles per SM, and enough to fill the GPU several
times), and one matrix of 8192 to 32768 rows (a batch-1 call), every pair the dispatch
could pick (the Triton or Gluon forward, the two-pass or ordered Gluon backward, where they
take the shape) is first checked against SDPA's flash backend (o and the three gradients
within twice the distance of SDPA's cuDNN backend from it, plus a few bf16 ulps), then
timed with SDPA cuDNN and flash in do_bench rounds taken in turn (device time; calls whose
host path is longer than their kernels show that time, as an eager caller sees it). The
default pair runs as FlashAttentionTriton runs it (with launches replayed from C++); the
others through FlashAttentionTritonKernels. A pair wins a shape where its median per-round
ratio to the default is below WIN; the table holds, per head dim, regions of (seq >= s,
tokens >= t) in which one pair beats the default at every grid point (`table`).
`--rows FILE.json` (repeatable) forms the table again from saved runs.

Usage: PYTHONPATH=src python studies/attention_dispatch/study.py [--out FILE.json]
[--head-dim D ...] (about 6 minutes on one H100 for all four head dims).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from systems.attention import FlashAttentionTriton, dispatch, get_attention
from systems.attention.dispatch import (
    DEFAULT,
    DETERMINISTIC_BACKWARDS,
    FORWARDS,
    HOPPER,
    WIN,
    Kernels,
    Rule,
)
from systems.attention.functions import FlashAttentionTritonKernels
from systems.bench.timing import interleaved_device_time

SEQS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 80, 96, 128)
# batch x heads x seq: at 128-row tiles, about 2 tiles per SM of an H100 (132 SMs), and 16.
TOKENS = (32768, 262144)
ONE_MATRIX_SEQS = (8192, 16384, 32768)  # and one matrix of each of these lengths
# (seq, tokens) points of the grid
POINTS = ([(seq, tokens) for seq in SEQS for tokens in TOKENS]
          + [(seq, seq) for seq in ONE_MATRIX_SEQS])
ROUNDS = 3
SPANS_MS = {"warmup_ms": 25, "rep_ms": 100}
RIVALS = ("sdpa_cudnn", "sdpa_flash")
SLACK_ULPS = 8
Shape = tuple[int, int, int]  # (seq, head dim, tokens)


def pairs(seq: int, head_dim: int, capability: tuple[int, int]) -> list[Kernels]:
    """Every deterministic pair that takes this shape, the default first."""
    found = [Kernels(f, b) for f, b in itertools.product(FORWARDS, DETERMINISTIC_BACKWARDS)]
    return [DEFAULT] + [k for k in found if k != DEFAULT and dispatch.runnable(
        k, capability, torch.bfloat16, head_dim, seq, True)]


def attention(kernels: Kernels) -> Callable[..., torch.Tensor]:
    if kernels == DEFAULT:
        return FlashAttentionTriton.apply
    return lambda q, k, v, c: FlashAttentionTritonKernels.apply(q, k, v, c, kernels.forward,
                                                                kernels.backward)


def inputs(seq: int, head_dim: int, tokens: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator(device="cuda").manual_seed(seq + head_dim + tokens)
    shape = (max(1, tokens // seq), seq, head_dim)  # (batch x heads, seq, d)
    return tuple(torch.randn((1, *shape), generator=generator, device="cuda",
                             dtype=torch.bfloat16) for _ in range(4))


def step(attend: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
         v: torch.Tensor, do: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """o and the three gradients of one forward + backward (as the perf cases' step)."""
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))

    def run() -> tuple[torch.Tensor, ...]:
        o = attend(*leaves, True)
        return (o, *torch.autograd.grad(o, leaves, do))

    return run


def _distance(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> list[float]:
    return [(x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True)]


def check(ours: tuple[torch.Tensor, ...], flash: tuple[torch.Tensor, ...],
          cudnn: tuple[torch.Tensor, ...]) -> str | None:
    """None where each output is as close to SDPA flash's as cuDNN's is (twice, plus a few
    bf16 ulps of its scale), else what is not."""
    eps = torch.finfo(torch.bfloat16).eps
    for name, mine, theirs, ref in zip(("o", "dq", "dk", "dv"), _distance(ours, flash),
                                       _distance(cudnn, flash), flash, strict=True):
        limit = 2 * theirs + SLACK_ULPS * eps * ref.abs().max().item()
        if not mine <= limit:  # NaN fails too
            return f"{name}: {mine:.3g} from SDPA flash, allowed {limit:.3g}"
    return None


def measure(seq: int, head_dim: int, tokens: int, capability: tuple[int, int]
            ) -> dict[str, object]:
    q, k, v, do = inputs(seq, head_dim, tokens)
    steps = {name: step(get_attention(name), q, k, v, do) for name in RIVALS}
    flash, cudnn = steps["sdpa_flash"](), steps["sdpa_cudnn"]()
    row: dict[str, object] = {"seq": seq, "head_dim": head_dim, "tokens": tokens,
                              "matrices": q.shape[1], "wrong": {}}
    for kernels in pairs(seq, head_dim, capability):
        run = step(attention(kernels), q, k, v, do)
        try:
            problem = check(run(), flash, cudnn)
        except (RuntimeError, ValueError) as error:  # a finding; the other shapes still run
            problem = f"{type(error).__name__}: {error}"
        if problem is None:
            steps[kernels.name] = run
        else:
            row["wrong"][kernels.name] = problem
    per_round = interleaved_device_time(steps, rounds=ROUNDS, **SPANS_MS)
    row["ms"] = {name: statistics.median(times) * 1e3 for name, times in per_round.items()}
    default = per_round.get(DEFAULT.name)
    row["over_default"] = {} if default is None else {
        name: statistics.median(t / d for t, d in zip(times, default, strict=True))
        for name, times in per_round.items()}
    return row


def winner(row: dict[str, object]) -> str:
    """The pair that beats the default by most at this shape, if by WIN, or the default."""
    ratios = beaters(row)
    return min(ratios, key=ratios.get) if ratios else DEFAULT.name


def beaters(row: dict[str, object]) -> dict[str, float]:
    """Each pair that beats the default by WIN at this shape: its ratio to the default."""
    return {name: r for name, r in row["over_default"].items()
            if name not in RIVALS and name != DEFAULT.name and r < WIN}


def table(rows: list[dict[str, object]], capability: tuple[int, int],
          head_dims: tuple[int, ...] = HEAD_DIMS) -> list[Rule]:
    """Rules of (seq >= s, tokens >= t) regions, per head dim: each names a pair that beats
    the default at every measured shape of its region. Greedily, the region that covers
    the most shapes no earlier rule covers comes first (ties: the pair's lower mean ratio
    over it); a shape two pairs both win may go to either, since either beats the default."""
    rules: list[Rule] = []
    for head_dim in head_dims:
        wins = {(r["seq"], r["tokens"]): beaters(r) for r in rows if r["head_dim"] == head_dim}
        names = sorted({name for won in wins.values() for name in won})
        covered: set[tuple[int, int]] = set()
        seqs, tokens = sorted({seq for seq, _ in wins}), sorted({t for _, t in wins})
        while True:
            best: tuple[int, float, str, int, int] | None = None
            for name, s, t in itertools.product(names, seqs, tokens):
                region = [point for point in wins if point[0] >= s and point[1] >= t]
                if not region or not all(name in wins[point] for point in region):
                    continue
                new = len(set(region) - covered)
                mean = statistics.fmean(wins[point][name] for point in region)
                if new and (best is None or (new, -mean) > (best[0], -best[1])):
                    best = (new, mean, name, s, t)
            if best is None:
                break
            _, _, name, s, t = best
            covered |= {point for point in wins if point[0] >= s and point[1] >= t}
            forward, backward = name.split("+")
            rules.append(Rule(capability, torch.bfloat16, head_dim, s, t,
                              Kernels(forward, backward)))
    return rules


def _print_row(row: dict[str, object]) -> None:
    cudnn = row["ms"].get("sdpa_cudnn")
    cells = ", ".join(f"{name} {ms:.3f}" + (f" ({ms / cudnn:.2f}x cuDNN)" if cudnn else "")
                      for name, ms in row["ms"].items())
    print(f"seq {row['seq']:>5} d {row['head_dim']:>3} tokens {row['tokens']:>6}: {cells}; "
          f"wins: {winner(row)}" + (f"; WRONG {row['wrong']}" if row["wrong"] else ""),
          flush=True)


def print_table(rules: list[Rule]) -> None:
    print("TABLE: tuple[Rule, ...] = (")
    for rule in rules:
        print(f"    Rule(HOPPER, torch.bfloat16, {rule.head_dim}, "
              f"min_seq={rule.min_seq}, min_tokens={rule.min_tokens},\n"
              f"         kernels=Kernels({rule.kernels.forward.upper()}, "
              f"{rule.kernels.backward.upper()})),")
    print(")")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write every row as JSON here")
    parser.add_argument("--rows", type=Path, action="append",
                        help="form the table from this saved run instead (repeatable: the "
                             "runs' rows together, e.g. of different head dims)")
    parser.add_argument("--head-dim", type=int, action="append", choices=HEAD_DIMS,
                        help="time only this head dim (repeatable; all by default)")
    args = parser.parse_args()
    head_dims = tuple(args.head_dim or HEAD_DIMS)
    if args.rows:
        runs = [json.loads(path.read_text()) for path in args.rows]
        rows = [row for run in runs for row in run["rows"]]
        for run in runs:
            print(f"{run['device']}, torch {run['torch']}")
        print("The table these rounds give:\n")
        print_table(table(rows, HOPPER, tuple(sorted({row["head_dim"] for row in rows}))))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    capability = torch.cuda.get_device_capability()
    if capability != HOPPER:
        print(f"the Gluon pairs need an sm_90 GPU; this is {capability}: only the default "
              "is timed", file=sys.stderr)
    dispatch.TABLE = ()  # FlashAttentionTriton runs the default pair whatever the table says
    started = time.perf_counter()
    rows = []
    for (seq, tokens), head_dim in itertools.product(POINTS, head_dims):
        rows.append(measure(seq, head_dim, tokens, capability))
        _print_row(rows[-1])
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.perf_counter() - started:.0f} s. The table these rounds give:\n")
    print_table(table(rows, capability, head_dims))
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                        "torch": torch.__version__, "rows": rows}, indent=1))
    wrong = [row for row in rows if row["wrong"]]
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
