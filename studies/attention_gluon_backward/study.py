"""Whether the fused Gluon backward (FA3's Hopper schedule: 5 tile matmuls per tile pair,
warp-specialised) beats our two-pass backward and cuDNN's, per config (one sm_90 GPU, bf16,
causal).

The kernel is the library's (`systems.attention.gluon.backward`): a producer warp
loads Q, dO, LSE and D by TMA into a ring of shared buffers, two consumer warpgroups own 64
keys each of a 128-key block and run S^T, dP^T, dV, dK and the query tile's dQ share, and
one or two writer warps add each warpgroup's half of the share into an fp32 accumulator by
TMA bulk reductions, in the order the halves arrive or, `ordered`, in a fixed order of key
blocks through a semaphore per query tile (deterministic). The schedule sets the order
programs launch and walk their query tiles in (`gluon_kernels`' docstring). Its time
counts, as our dQ pass and cuDNN's backward do, D = rowsum(O * dO) with zeroing the
accumulator (one Triton kernel before) and dQ = acc * scale cast to bf16 (one after). Per
head dim it reports each backward's max abs errors against an fp32 reference
(attention_dq_reduce's), how far two runs of a config's dQ differ, and do_bench medians of
our forward and two-pass backward (and of its dQ pass, D included, and its dK/dV pass
alone: dq_pass_ms, dkdv_pass_ms), cuDNN's forward and backward and each config. A config
that fails to build or run is recorded as an error row.

The ablations and other dQ modes of earlier runs (atomics, whole-share hand-off, discard,
skip, half reductions, early slot release, landed without a turn) were measured by this
script as of commit 0818cb0; their runs are saved beside it.

Usage: PYTHONPATH=src python -m studies.attention_gluon_backward.study --out DIR --commit HASH
       TRITON_INTERPRET=0 PYTHONPATH=src \
           python -m studies.attention_gluon_backward.study --build-only
(--build-only builds every config for sm_90 without a GPU and reports its resources.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, astuple, replace

import torch

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
from systems.attention.gluon.backward import CONFIGS as LIBRARY_CONFIGS
from systems.attention.gluon.backward import (
    FULL_ORDERED_CONFIGS,
    HEAD_DIMS,
    ONE_MATRIX_ORDERED_CONFIGS,
    PREPARE_ROWS,
    SCHEDULES,
    SHORT_ORDERED_CONFIGS,
    GluonConfig,
    build,
    gluon_backward,
)
from systems.attention.gluon.backward_kernel import BLOCK_N, finish_kernel, prepare_kernel
from systems.kernel_runtime.triton_build import HOPPER_SHARED_BYTES


def _variants(head_dim: int) -> list[GluonConfig]:
    """The library's two configs, then the other schedules and writer counts, the unordered
    one with the ordered one's settings, then each library config (the short-matrix and
    one-matrix ordered ones too, and the ordered one descending) in the three orders of a
    tile's last matmuls (synchronous; overlapped with dQ last; overlapped in FA3's order,
    dQ first), then at d = 64 the two with the other tile height (64 or 128 query rows),
    overlapped MMAs or not (both fit the consumers' registers), then the short-matrix
    ordered one (longest first) on 2 and 4 chains of accumulators, with 1 and 2 writers."""
    chosen = [LIBRARY_CONFIGS[head_dim, False], LIBRARY_CONFIGS[head_dim, True]]
    others = [replace(chosen[ordered], ordered=bool(ordered), schedule=schedule,
                      writers=writers)
              for ordered in (0, 1) for schedule in SCHEDULES for writers in (1, 2)]
    others.append(replace(chosen[1], ordered=False, schedule=chosen[0].schedule))
    orders = [replace(config, async_mma=overlap, dq_first=dq_first)
              for config in chosen + [SHORT_ORDERED_CONFIGS[head_dim],
                                      replace(chosen[1], schedule="descending"),
                                      ONE_MATRIX_ORDERED_CONFIGS[head_dim]]
              for overlap, dq_first in ((False, False), (True, False), (True, True))]
    heights = [replace(config, block_m={64: 128, 128: 64}[config.block_m], async_mma=overlap,
                       dq_first=config.dq_first and overlap)
               for config in chosen for overlap in (True, False)] if head_dim == 64 else []
    chained = [replace(SHORT_ORDERED_CONFIGS[head_dim], chains=chains, writers=writers)
               for chains in (2, 4) for writers in (1, 2)]
    variants = chosen + [c for c in others + orders + heights + chained if c not in chosen]
    return list(dict.fromkeys(variants))


LIBRARY = {d: (LIBRARY_CONFIGS[d, False], LIBRARY_CONFIGS[d, True], SHORT_ORDERED_CONFIGS[d],
               *([FULL_ORDERED_CONFIGS[d]] if d in FULL_ORDERED_CONFIGS else []))
           for d in HEAD_DIMS}
CONFIGS: dict[int, list[GluonConfig]] = {head_dim: _variants(head_dim)
                                         for head_dim in HEAD_DIMS}
"""Per head dim, the library's unordered and ordered configs (the fastest of earlier H100
runs at 16 x 16384), then each with the other schedules and writer count, and at d = 64
each with the other tile height."""


def build_only(emit: Callable[[dict[str, object]], None]) -> None:
    """Every config built for sm_90 as the GPU run specialises it."""
    for head_dim, configs in CONFIGS.items():
        for config in configs:
            row: dict[str, object] = {"head_dim": head_dim, "config": asdict(config),
                                      "max_regs": config.max_regs}
            try:
                row |= build(head_dim, config)
                row["fits"] = row["shared_bytes"] <= HOPPER_SHARED_BYTES
            except Exception as error:  # recorded per config
                row["error"] = f"{type(error).__name__}: {first_line(error)}"
            emit(row)


def measure(batch: int, seq: int, head_dim: int, emit: Callable[[dict[str, object]], None]
            ) -> None:
    torch.manual_seed(0)
    inputs = tune.make_inputs(batch, seq, head_dim, torch.bfloat16, True)
    q, k, v, o, lse, do = (inputs[n] for n in ("q", "k", "v", "o", "lse", "do"))
    base = {"batch": batch, "seq": seq, "head_dim": head_dim, "dtype": "bf16", "causal": True}
    expected = reference_grads(inputs, True)
    emit({**base, "kind": "reference", **{f"{name}max_abs": g.abs().max().item()
                                          for name, g in zip(GRADS, expected, strict=True)}})

    tiles = launch.default_config(head_dim, torch.bfloat16)

    def dq_pass() -> tuple[torch.Tensor, torch.Tensor]:  # (dq, D): D is computed here
        return launch.backward_dq(q, k, v, o, lse, do, True, tiles.backward_dq)

    def dkdv_pass(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return launch.backward_dkdv(q, k, v, do, lse, delta, True, tiles.backward_dkdv)

    def two_pass() -> tuple[torch.Tensor, ...]:
        dq, delta = dq_pass()
        return dq, *dkdv_pass(delta)

    ours = two_pass()
    delta = dq_pass()[1]
    forward_ms = bench_ms(lambda: launch.flash_forward(q, k, v, True))
    backward_ms = bench_ms(two_pass)
    emit({**base, "kind": "two_pass", "dq_config": astuple(tiles.backward_dq),
          "dkdv_config": astuple(tiles.backward_dkdv), **errors(ours, expected, "vs_ref"),
          "forward_ms": forward_ms, "backward_ms": backward_ms,
          "dq_pass_ms": bench_ms(dq_pass), "dkdv_pass_ms": bench_ms(lambda: dkdv_pass(delta))})

    def run(config: GluonConfig, poison: bool = False) -> tuple[torch.Tensor, ...]:
        return gluon_backward(q, k, v, o, lse, do, True, config=config, poison=poison)

    def variant(config: GluonConfig) -> dict[str, object]:
        first = run(config, poison=True)
        found: dict[str, object] = errors(first, expected, "vs_ref")
        found |= errors(first, ours, "vs_two_pass")
        second = run(config, poison=True)
        found["dq_run_to_run"] = max_abs(first[0], second[0])
        del first, second
        found["backward_ms"] = bench_ms(lambda: run(config))
        found["backward_vs_two_pass"] = found["backward_ms"] / backward_ms
        return found

    # cuDNN before the variants: a variant's fault would leave the CUDA context unusable.
    cudnn = attempt({**base, "kind": "cudnn"}, lambda: cudnn_row(q, k, v, do, expected))
    emit(cudnn)
    timed = []
    for config in CONFIGS[head_dim]:
        row = attempt({**base, "kind": "gluon", "config": asdict(config),
                       "library": config in LIBRARY[head_dim]},
                      lambda c=config: variant(c))
        timed += [row] if "backward_ms" in row else []
        emit(row)
    best = min(timed, key=lambda r: r["backward_ms"]) if timed else {}
    emit({**base, "kind": "summary", "forward_ms": forward_ms,
          "prepare_finish_ms": bench_ms(lambda: prepare_and_finish(o, do)),
          "cudnn_forward_ms": cudnn.get("forward_ms"), "two_pass_backward_ms": backward_ms,
          "best_gluon_config": best.get("config"),
          "best_gluon_backward_ms": best.get("backward_ms"),
          "cudnn_backward_ms": cudnn.get("backward_ms")})


def prepare_and_finish(o: torch.Tensor, do: torch.Tensor) -> None:
    """The kernels before and after the backward, on buffers allocated as it allocates
    with one dQ accumulator (the configs of many matrices) of the d = 128 configs' 64-row
    tiles (a power-of-two head dim: no tail)."""
    rows = o.reshape(-1, o.shape[-1])
    delta = torch.empty(rows.shape[0], dtype=torch.float32, device=o.device)
    acc = torch.empty(rows.shape, dtype=torch.float32, device=o.device)
    grid = (rows.shape[0] // PREPARE_ROWS,)
    sizes = {"HEAD_DIM": rows.shape[1], "ROWS": PREPARE_ROWS, "CHAINS": 1}
    prepare_kernel[grid](rows, do.reshape(rows.shape), delta, acc, **sizes)
    finish_kernel[grid](acc, torch.empty_like(rows), rows.shape[1] ** -0.5, **sizes,
                        BLOCK_M=64, MAIN=rows.shape[1])


def main() -> int:
    return run_study("attention_gluon_backward", __doc__.split("\n\n")[0], list(CONFIGS),
                     build_only, measure, seq_multiple=BLOCK_N)


if __name__ == "__main__":
    raise SystemExit(main())
