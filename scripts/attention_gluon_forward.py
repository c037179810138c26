"""Whether a warp-specialised forward in Gluon (`gluon_forward.py`: a producer warp, two
consumer warpgroups, FA3's overlap of the softmax with the previous tile's P V) beats our
Triton forward and cuDNN's, per config (one sm_90 GPU, bf16, causal).

Per head dim: each forward's max abs errors in O and L against an fp32 reference on the
first matrices (the Gluon forward's outputs poisoned with NaN first), and do_bench medians
of our Triton forward, cuDNN's (LSE kept, as training runs it) and each Gluon config;
then forward + backward with the Gluon backward (ordered and unordered) behind either of
our forwards, beside cuDNN's forward + backward, all in one process.

Usage: PYTHONPATH=src python scripts/attention_gluon_forward.py --out DIR --commit HASH
       TRITON_INTERPRET=0 PYTHONPATH=src python scripts/attention_gluon_forward.py --build-only
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F
from attention_dq_reduce import _bench, _max_abs, attempt, run_study
from torch.nn.attention import SDPBackend, sdpa_kernel

from systems.attention.causal import causal_mask
from systems.attention.flash_triton import launch
from systems.attention.flash_triton.gluon_forward import (
    CONFIGS,
    GluonForwardConfig,
    build,
    gluon_forward,
)
from systems.attention.flash_triton.gluon_launch import gluon_backward
from systems.triton_build import HOPPER_SHARED_BYTES

Emit = Callable[[dict[str, object]], None]
CHECKED_MATRICES = 2


def candidates(head_dim: int) -> list[GluonForwardConfig]:
    """The library's config first, then each other ring depth that fits in shared memory
    (at d = 64 a fourth stage does), each with and without the overlap and the ping-pong."""
    others = [GluonForwardConfig(block_n=128, num_stages=stages, async_mma=overlap,
                                 pingpong=pingpong)
              for stages in ((2, 3, 4) if head_dim == 64 else (2, 3))
              for overlap in (True, False) for pingpong in (True, False)]
    return [CONFIGS[head_dim], *(c for c in others if c != CONFIGS[head_dim])]


def build_only(emit: Emit) -> None:
    for head_dim in CONFIGS:
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


def _errors(o: torch.Tensor, lse: torch.Tensor, expected: tuple[torch.Tensor, torch.Tensor]
            ) -> dict[str, object]:
    n = CHECKED_MATRICES
    return {"o_vs_ref": _max_abs(o[:n], expected[0]), "lse_vs_ref": _max_abs(lse[:n], expected[1]),
            "nan": bool(o.isnan().any() or lse.isnan().any())}


def measure(batch: int, seq: int, head_dim: int, emit: Emit) -> None:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, seq, head_dim, dtype=torch.bfloat16, device="cuda")
                   for _ in range(4))
    base = {"batch": batch, "seq": seq, "head_dim": head_dim, "dtype": "bf16", "causal": True}
    expected = reference(q, k, v)
    o_t, lse_t = launch.flash_forward(q, k, v, True)
    emit({**base, "kind": "triton_forward", **_errors(o_t, lse_t, expected),
          "ms": _bench(lambda: launch.flash_forward(q, k, v, True))})

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qc, kc, vc = (t.view(batch, 1, seq, head_dim).detach().requires_grad_()
                      for t in (q, k, v))
        doc = do.view(batch, 1, seq, head_dim)

        def cudnn_step() -> None:
            out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
            torch.autograd.grad(out, (qc, kc, vc), doc)

        cudnn_fwd = _bench(lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True))
        cudnn_total = _bench(cudnn_step)
    emit({**base, "kind": "cudnn", "forward_ms": cudnn_fwd, "total_ms": cudnn_total})

    for config in candidates(head_dim):
        def row(c: GluonForwardConfig = config) -> dict[str, object]:
            o, lse = gluon_forward(q, k, v, True, c, poison=True)
            found = _errors(o, lse, expected)
            found["o_vs_triton"] = _max_abs(o, o_t)
            found["lse_vs_triton"] = _max_abs(lse, lse_t)
            found["ms"] = _bench(lambda: gluon_forward(q, k, v, True, c))
            return found
        emit(attempt({**base, "kind": "gluon_forward", **asdict(config)}, row))

    forwards = {"triton": lambda: launch.flash_forward(q, k, v, True),
                "gluon": lambda: gluon_forward(q, k, v, True)}
    for name, forward in forwards.items():
        for deterministic in (False, True):
            def step(f: Callable = forward, det: bool = deterministic) -> None:
                o, lse = f()
                gluon_backward(q, k, v, o, lse, do, True, det)
            ms = _bench(step)
            emit({**base, "kind": "forward_backward", "forward": name,
                  "deterministic": deterministic, "ms": ms, "over_cudnn": ms / cudnn_total})


def main() -> int:
    return run_study("attention_gluon_forward", __doc__.split("\n\n")[0], list(CONFIGS),
                     build_only, measure, seq_multiple=128)


if __name__ == "__main__":
    raise SystemExit(main())
