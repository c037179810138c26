"""Whether a warp-specialised forward in Gluon (`gluon_forward.py`: a producer warp, two
consumer warpgroups, FA3's overlap of the softmax with the previous tile's P V, its
ping-pong and its persistent grid) beats our Triton forward and cuDNN's, per config (one
sm_90 GPU, bf16, causal).

Per head dim: each forward's max abs errors in O and L against an fp32 reference on the
first matrices (the Gluon forward's outputs poisoned with NaN first), a do_bench median of
our Triton forward and of each Gluon config; then rounds (`emit_rounds`) timing in turn
the Triton forward, one Gluon config with a program per tile and persistent, each before
the unordered Gluon backward, and the
perf cases' forward + backward steps of cuDNN and of ours (two passes, Gluon ordered and
unordered), all in one process.

Usage: PYTHONPATH=src python -m studies.attention_gluon_forward.study --out DIR --commit HASH
       TRITON_INTERPRET=0 PYTHONPATH=src \
           python -m studies.attention_gluon_forward.study --build-only
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, replace

import torch

from studies.harness import attempt, bench_ms, max_abs, run_study
from systems.attention.flash_triton import launch
from systems.attention.gluon.backward import HEAD_DIMS, gluon_backward
from systems.attention.gluon.forward import CONFIGS, GluonForwardConfig, build, gluon_forward
from systems.attention.shared.causal import causal_mask
from systems.bench.attention import build_attention_workload
from systems.kernel_runtime.triton_build import HOPPER_SHARED_BYTES

Emit = Callable[[dict[str, object]], None]
CHECKED_MATRICES = 2
ROUNDS = 5
STEP_IMPLEMENTATIONS = ("sdpa_cudnn", "triton_gluon_bwd_unordered", "triton_gluon_bwd",
                        "triton")
# The Gluon forward the rounds time at each head dim: the library's where it has one.
ROUND_CONFIGS = {64: GluonForwardConfig(block_n=128, num_stages=4, async_mma=False,
                                        pingpong=False),
                 **CONFIGS}


def candidates(head_dim: int) -> list[GluonForwardConfig]:
    """The rounds' config first, then each ring depth of three or more stages that fits in
    shared memory (two were the slowest at both head dims, at ec2ed9a), each with and
    without the overlap, the ping-pong and the persistent grid."""
    others = [GluonForwardConfig(block_n=128, num_stages=stages, async_mma=overlap,
                                 pingpong=pingpong, persistent=persistent)
              for stages in ((3, 4) if head_dim == 64 else (3,))
              for overlap in (True, False) for pingpong in (True, False)
              for persistent in (False, True)]
    first = ROUND_CONFIGS[head_dim]
    return [first, *(c for c in others if c != first)]


def build_only(emit: Emit) -> None:
    for head_dim in HEAD_DIMS:
        for config in candidates(head_dim):
            row = attempt({"kind": "build", "head_dim": head_dim, **asdict(config)},
                          lambda h=head_dim, c=config: build(h, c))
            row["fits"] = row.get("shared_bytes", HOPPER_SHARED_BYTES + 1) <= HOPPER_SHARED_BYTES
            emit(row)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (O, L) of the first CHECKED_MATRICES matrices, causal."""
    outs, lses = [], []
    for i in range(CHECKED_MATRICES):
        q1, k1, v1 = (t[i].float() for t in (q, k, v))
        scores = (q1 @ k1.T) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~causal_mask(*scores.shape, q.device), float("-inf"))
        lses.append(torch.logsumexp(scores, -1))
        outs.append(torch.softmax(scores, -1) @ v1)
        del scores
    return torch.stack(outs), torch.stack(lses)


def errors(o: torch.Tensor, lse: torch.Tensor, expected: tuple[torch.Tensor, torch.Tensor]
            ) -> dict[str, object]:
    n = CHECKED_MATRICES
    return {"o_vs_ref": max_abs(o[:n], expected[0]), "lse_vs_ref": max_abs(lse[:n], expected[1]),
            "nan": bool(o.isnan().any() or lse.isnan().any())}


def measure(batch: int, seq: int, head_dim: int, emit: Emit) -> None:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, seq, head_dim, dtype=torch.bfloat16, device="cuda")
                   for _ in range(4))
    base = {"batch": batch, "seq": seq, "head_dim": head_dim, "dtype": "bf16", "causal": True}
    expected = reference(q, k, v)
    o_t, lse_t = launch.flash_forward(q, k, v, True)
    emit({**base, "kind": "triton_forward", **errors(o_t, lse_t, expected),
          "ms": bench_ms(lambda: launch.flash_forward(q, k, v, True))})
    for config in candidates(head_dim):
        def row(c: GluonForwardConfig = config) -> dict[str, object]:
            o, lse = gluon_forward(q, k, v, True, c, poison=True)
            found = errors(o, lse, expected)
            found["o_vs_triton"] = max_abs(o, o_t)
            found["lse_vs_triton"] = max_abs(lse, lse_t)
            found["ms"] = bench_ms(lambda: gluon_forward(q, k, v, True, c))
            return found
        emit(attempt({**base, "kind": "gluon_forward", **asdict(config)}, row))
    emit_rounds(base, _round_timers(q, k, v, do, batch, seq, head_dim), emit)


def _round_timers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                  batch: int, seq: int, head_dim: int) -> dict[str, Callable[[], object]]:
    """What the rounds time: each forward alone, either before the unordered Gluon
    backward (direct calls), and the forward + backward step of the perf cases (the
    registry's implementations through autograd, `build_attention_workload`)."""
    config = ROUND_CONFIGS[head_dim]
    one_per_tile, persistent = (replace(config, persistent=p) for p in (False, True))
    forwards = {"triton": lambda: launch.flash_forward(q, k, v, True),
                "gluon": lambda: gluon_forward(q, k, v, True, one_per_tile),
                "gluon persistent": lambda: gluon_forward(q, k, v, True, persistent)}
    timers: dict[str, Callable[[], object]] = {f"forward {name}": forward
                                               for name, forward in forwards.items()}
    for name, forward in forwards.items():
        def step(f: Callable = forward) -> None:
            o, lse = f()
            gluon_backward(q, k, v, o, lse, do, True, False)
        timers[f"forward {name} + gluon backward unordered"] = step
    for impl in STEP_IMPLEMENTATIONS:
        workload = build_attention_workload(impl, shape=(batch, 1, seq, head_dim),
                                            dtype=torch.bfloat16, mode="forward_backward",
                                            is_causal=True, device=torch.device("cuda"))
        timers[f"step {impl}"] = workload.step
    return timers


def emit_rounds(base: dict[str, object], timers: dict[str, Callable[[], object]],
                emit: Emit) -> None:
    """ROUNDS rounds, each timing every entry once in turn (do_bench medians), so that a
    GPU warming over the run weighs on all alike; then each entry's median over rounds and,
    for the steps, the median and range of their per-round ratios to cuDNN's step."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    for round_index in range(ROUNDS):
        for name, timer in timers.items():
            times[name].append(bench_ms(timer))
        emit({**base, "kind": "round", "round": round_index,
              "ms": {name: runs[-1] for name, runs in times.items()}})
    rival = times["step sdpa_cudnn"]
    for name, runs in times.items():
        row = {**base, "kind": "rounds", "name": name, "ms_per_round": runs,
               "median_ms": statistics.median(runs)}
        if name.startswith("step"):
            ratios = [ours / theirs for ours, theirs in zip(runs, rival, strict=True)]
            row["over_cudnn_median"] = statistics.median(ratios)
            row["over_cudnn_range"] = [min(ratios), max(ratios)]
        emit(row)


def main() -> int:
    return run_study("attention_gluon_forward", __doc__.split("\n\n")[0], list(HEAD_DIMS),
                     build_only, measure, seq_multiple=128)


if __name__ == "__main__":
    raise SystemExit(main())
