"""Whether a fused FlashAttention backward with dQ summed through TMA bulk reductions beats
our two-pass backward (one CUDA GPU, bf16, causal).

Our backward runs a dQ pass (3 tile matmuls per tile pair: S, dP, dQ) and a dK/dV pass
(4: S, dP, dV, dK), 7 in all. FA2/FA3 run 5 by adding each key tile's dQ share into an fp32
accumulator from inside the dK/dV pass. Per-element `tl.atomic_add` did that slower than the
two passes (studies/attention_dq_reduce/README.md); FA3 instead adds a whole tile
per bulk op (cp.reduce.async.bulk.tensor, done by the copy engine), which is what
`fused_backward_kernel` does through a tensor descriptor's `atomic_add`.

The variant's time counts everything it needs besides the kernel: D = rowsum(O * dO) in
PyTorch, zeroing the fp32 accumulator, and dQ = (acc * scale).to(dtype). Per head dim it
reports the gradients' max abs errors against an fp32 PyTorch reference (SDPA math on
upcast inputs, one matrix at a time) for our two-pass backward, each variant tile config
and cuDNN; how far two runs of the variant differ (the reductions' order is not fixed);
and do_bench medians of each backward and of our and cuDNN's forward.

Usage: PYTHONPATH=src python -m studies.attention_dq_reduce.study --out DIR --commit HASH
       TRITON_INTERPRET=0 PYTHONPATH=src python -m studies.attention_dq_reduce.study --build-only
(--build-only builds every config for sm_90 without a GPU and reports its resources.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

from studies.harness import (
    GRADS,
    attempt,
    bench_ms,
    cudnn_row,
    errors,
    first_line,
    max_abs,
    reference_grads,
    run_study,
)
from systems.attention.flash_triton import launch, tune
from systems.attention.flash_triton.kernels import (
    LOG2E,
    load_rows,
    matrix_base,
    next_tile,
    program_tile,
    query_row_stats,
    query_stages,
    sees,
    store_rows,
)
from systems.kernel_runtime.triton_build import HOPPER_SHARED_BYTES, build_for_hopper

# (BLOCK_M, BLOCK_N, num_warps, num_stages) of the variant, by head dim.
CONFIGS: dict[int, list[tuple[int, int, int, int]]] = {
    64: [(32, 128, 4, 5), (32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (16, 128, 4, 4),
         (32, 64, 4, 3)],
    128: [(64, 128, 8, 3), (32, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3), (32, 64, 4, 3),
          (16, 128, 4, 3)],
}


@triton.jit
def _fused_stage(dk, dv, k, v, q_tiles, do_tiles, dq_tiles, L, Delta, b, h, keys, offs_m,
                 n_q, qk_scale, lo, hi, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 CHECK_ROWS: tl.constexpr, MASKED: tl.constexpr):
    # `_dkdv_stage` for half precision without a split, plus each query tile's dQ share.
    for q_start in range(lo, hi, BLOCK_M):
        rows = q_start + offs_m
        q = next_tile(q_tiles, b, h, q_start, 0, BLOCK_M, HEAD_DIM)
        do = next_tile(do_tiles, b, h, q_start, 0, BLOCK_M, HEAD_DIM)
        lse2, delta = query_row_stats(L, Delta, rows, n_q, CHECK_ROWS)
        s_t = tl.dot(k, tl.trans(q))
        p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(sees(rows[None, :], keys[:, None]), p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        # dQ[rows] += dS[rows, keys] K[keys]; dS is ds_t transposed. TMA drops rows past n_q.
        dq_part = tl.dot(tl.trans(ds_t), k)
        dq_tiles.atomic_add([b, h, q_start, 0], dq_part.reshape(1, 1, BLOCK_M, HEAD_DIM))
    return dk, dv


@triton.jit
def fused_backward_kernel(
    q_tiles, do_tiles, dq_tiles, K, V, dK, dV, L, Delta, stride_b, stride_h, stride_s,
    n_heads, n_q, n_k, SM_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, CHECK_Q_ROWS: tl.constexpr,
):
    """Grid (BH, key tiles). dV = P^T dO and dK = scale * dS^T Q as in
    `flash_backward_dkdv_kernel`, and dS K added into dq_tiles (fp32, unscaled). K, V, dK
    and dV share strides."""
    # Every matrix in one section (no group): matrices fastest, as the study's runs took them.
    bh, b, h, k_start, keys, cols_d = program_tile(n_heads, 0, BLOCK_N, HEAD_DIM, False, False)
    qk_scale = SM_SCALE * LOG2E
    k = load_rows(matrix_base(K, b, h, stride_b, stride_h), keys, cols_d, n_k, stride_s, HEAD_DIM)
    v = load_rows(matrix_base(V, b, h, stride_b, stride_h), keys, cols_d, n_k, stride_s, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    L += bh.to(tl.int64) * n_q
    Delta += bh.to(tl.int64) * n_q

    offs_m = tl.arange(0, BLOCK_M)
    start, full_start = query_stages(k_start, n_q, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dk, dv = _fused_stage(dk, dv, k, v, q_tiles, do_tiles, dq_tiles, L, Delta, b, h, keys,
                          offs_m, n_q, qk_scale, start, full_start, HEAD_DIM, BLOCK_M,
                          CHECK_Q_ROWS, True)
    dk, dv = _fused_stage(dk, dv, k, v, q_tiles, do_tiles, dq_tiles, L, Delta, b, h, keys,
                          offs_m, n_q, qk_scale, full_start, n_q, HEAD_DIM, BLOCK_M,
                          CHECK_Q_ROWS, False)
    store_rows(matrix_base(dK, b, h, stride_b, stride_h), dk * SM_SCALE, keys, cols_d, n_k,
                stride_s, HEAD_DIM)
    store_rows(matrix_base(dV, b, h, stride_b, stride_h), dv, keys, cols_d, n_k, stride_s,
                HEAD_DIM)


def _constexprs(head_dim: int, block_m: int, block_n: int, is_causal: bool,
                check_rows: bool) -> dict[str, object]:
    return {"SM_SCALE": head_dim ** -0.5, "HEAD_DIM": head_dim, "BLOCK_M": block_m,
            "BLOCK_N": block_n, "IS_CAUSAL": is_causal, "CHECK_Q_ROWS": check_rows}


def fused_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool,
                   tiles: launch.TileConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of contiguous half-precision (..., seq, d) self-attention inputs, d a
    power of two; lse is flash_forward's."""
    *lead, n, d = q.shape
    bh = math.prod(lead)
    assert all(t.is_contiguous() for t in (q, k, v, o, lse, do)) and k.shape == q.shape
    delta = (o.float() * do.float()).sum(-1)
    acc = torch.zeros(1, bh, n, d, dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    shape, strides = (1, bh, n, d), (bh * n * d, n * d, d, 1)

    def tiles_of(t: torch.Tensor) -> TensorDescriptor:
        return TensorDescriptor(t, shape, strides, [1, 1, tiles.block_m, d])

    fused_backward_kernel[(bh, triton.cdiv(n, tiles.block_n))](
        tiles_of(q), tiles_of(do), tiles_of(acc), k, v, dk, dv, lse, delta, *strides[:3],
        bh, n, n, **_constexprs(d, tiles.block_m, tiles.block_n, is_causal, n % tiles.block_m != 0),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return (acc * d ** -0.5).to(q.dtype).view(q.shape), dk, dv


def build_only(emit: Callable[[dict[str, object]], None]) -> None:
    """Every config built for sm_90 as the GPU run specialises it (causal, 16384 rows: no
    row check) and non-causal with the row check (the other paths)."""
    for head_dim, configs in CONFIGS.items():
        for block_m, block_n, warps, stages in configs:
            row: dict[str, object] = {"head_dim": head_dim,
                                      "config": [block_m, block_n, warps, stages]}
            for label, causal, check in (("causal", True, False),
                                         ("noncausal_checked", False, True)):
                constexprs = _constexprs(head_dim, block_m, block_n, causal, check)
                signature = {name: "i32" for name in fused_backward_kernel.arg_names}
                signature |= {name: "constexpr" for name in constexprs}
                signature |= {name: f"tensordesc<bf16[1, 1, {block_m}, {head_dim}]>"
                              for name in ("q_tiles", "do_tiles")}
                signature |= {"dq_tiles": f"tensordesc<fp32[1, 1, {block_m}, {head_dim}]>",
                              "L": "*fp32", "Delta": "*fp32"}
                signature |= {name: "*bf16" for name in ("K", "V", "dK", "dV")}
                try:
                    built = build_for_hopper(fused_backward_kernel, signature, constexprs,
                                             num_warps=warps, num_stages=stages)
                    built["fits"] = built["shared_bytes"] <= HOPPER_SHARED_BYTES
                except Exception as error:  # recorded per config
                    built = {"error": f"{type(error).__name__}: {first_line(error)}"}
                row[label] = built
            emit(row)


def measure(batch: int, seq: int, head_dim: int, emit: Callable[[dict[str, object]], None]
            ) -> None:
    dtype, is_causal = torch.bfloat16, True
    torch.manual_seed(0)
    inputs = tune.make_inputs(batch, seq, head_dim, dtype, is_causal)
    q, k, v, o, lse, do = (inputs[n] for n in ("q", "k", "v", "o", "lse", "do"))
    base = {"batch": batch, "seq": seq, "head_dim": head_dim, "dtype": "bf16",
            "causal": is_causal}
    expected = reference_grads(inputs, is_causal)
    emit({**base, "kind": "reference", **{f"{name}max_abs": g.abs().max().item()
                                          for name, g in zip(GRADS, expected, strict=True)},
          "delta_torch_vs_kernel": max_abs((o.float() * do.float()).sum(-1),
                                            inputs["delta"])})

    config = launch.default_config(head_dim, dtype)

    def two_pass() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, delta = launch.backward_dq(q, k, v, o, lse, do, is_causal, config.backward_dq)
        return (dq, *launch.backward_dkdv(q, k, v, do, lse, delta, is_causal,
                                          config.backward_dkdv))

    ours = two_pass()
    forward_ms = bench_ms(lambda: launch.flash_forward(q, k, v, is_causal))
    backward_ms = bench_ms(two_pass)
    emit({**base, "kind": "two_pass", "dq_config": astuple(config.backward_dq),
          "dkdv_config": astuple(config.backward_dkdv), **errors(ours, expected, "vs_ref"),
          "forward_ms": forward_ms, "backward_ms": backward_ms,
          "total_ms": forward_ms + backward_ms})

    fused = []
    for shape in CONFIGS[head_dim]:
        tiles = launch.TileConfig(*shape)
        row: dict[str, object] = {**base, "kind": "fused_tma_reduce", "config": list(shape)}
        try:
            first = fused_backward(q, k, v, o, lse, do, is_causal, tiles)
            second = fused_backward(q, k, v, o, lse, do, is_causal, tiles)
            row |= errors(first, expected, "vs_ref") | errors(first, ours, "vs_two_pass")
            row |= {f"{name}_run_to_run": max_abs(a, b)
                    for name, a, b in zip(GRADS, first, second, strict=True)}
            del first, second
            row["backward_ms"] = bench_ms(lambda t=tiles: fused_backward(q, k, v, o, lse, do,
                                                                       is_causal, t))
            row["total_ms"] = forward_ms + row["backward_ms"]
            row["backward_vs_two_pass"] = row["backward_ms"] / backward_ms
        except Exception as error:  # recorded per config
            row["error"] = f"{type(error).__name__}: {first_line(error)}"
        fused.append(row)
        emit(row)

    cudnn = attempt({**base, "kind": "cudnn"}, lambda: cudnn_row(q, k, v, do, expected))
    emit(cudnn)
    timed = [r for r in fused if "backward_ms" in r]
    best = min(timed, key=lambda r: r["backward_ms"]) if timed else {}
    emit({**base, "kind": "summary", "two_pass_backward_ms": backward_ms,
          "best_fused_config": best.get("config"), "best_fused_backward_ms":
          best.get("backward_ms"), "cudnn_backward_ms": cudnn.get("backward_ms"),
          "two_pass_total_ms": forward_ms + backward_ms,
          "best_fused_total_ms": best.get("total_ms"), "cudnn_total_ms": cudnn.get("total_ms")})


def main() -> int:
    return run_study("attention_dq_reduce", __doc__.split("\n\n")[0], list(CONFIGS),
                     build_only, measure)


if __name__ == "__main__":
    raise SystemExit(main())
