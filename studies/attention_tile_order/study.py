"""Whether taking the query tiles a section of matrices at a time (`shared.tile_order`)
beats every matrix at once, per forward and shape (one GPU, bf16, causal).

For each (matrices, seq, d) it runs the forwards whose tile order the sections change (the
Gluon forward where it takes the head dim, the Triton forward) with the library's order
and with one section of every matrix
(`tile_order.SPREAD_TILES` = 0), checks that both give the same outputs bit for bit
(replayed calls, NaN-poisoned first), and times CUDA-graph replays of each in rounds taken
in turn with cuDNN's forward (device time, do_bench medians). Shapes the rule leaves in one
section run the one order and are timed once.

Usage: PYTHONPATH=src python -m studies.attention_tile_order.study --out DIR --commit HASH
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from studies.harness import bench_ms, graphed, measure_shapes, run_record
from systems.attention.flash_triton.launch import flash_forward, forget_plans
from systems.attention.gluon.forward import CONFIGS, forward_head_dim, gluon_forward
from systems.attention.host_path import replay
from systems.attention.shared import tile_order

ROUNDS = 6
SHAPES = ((128, 2048, 128), (64, 4096, 128), (48, 4096, 128), (32, 8192, 128),
          (256, 1024, 128), (16, 16384, 128), (16, 2048, 128),
          (128, 8192, 64), (256, 2048, 64), (128, 4096, 64), (64, 4096, 64),
          (16, 16384, 64), (128, 1024, 64),
          (256, 2048, 80), (128, 2048, 80), (128, 512, 80))
ORDERS = ("one section", "library")
LIBRARY_SPREAD = tile_order.SPREAD_TILES
Kernel = Callable[[], object]


def use_order(order: str) -> None:
    """Make the next calls plan with `order`'s tile order."""
    tile_order.SPREAD_TILES = 0 if order == "one section" else LIBRARY_SPREAD
    forget_plans()
    replay.forget()


def kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Kernel]:
    timed = {"triton forward": lambda: flash_forward(q, k, v, True)}
    if forward_head_dim(q.shape[-1]) == q.shape[-1] and q.shape[-1] in CONFIGS:
        timed["gluon forward"] = lambda: gluon_forward(q, k, v, True)
    return timed


def poisoned_outputs(timed: dict[str, Kernel]) -> dict[str, list[torch.Tensor]]:
    """Each kernel's outputs from a replayed call whose outputs were NaN first."""
    replay.set_poison(True)
    try:
        outputs = {}
        for name, fn in timed.items():
            fn()  # the plan; the next call is replayed
            result = fn()
            outputs[name] = [t.clone() for t in (result if isinstance(result, tuple)
                                                 else (result,))]
        return outputs
    finally:
        replay.set_poison(False)


def measure(shape: tuple[int, int, int]) -> dict[str, object]:
    matrices, seq, d = shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, matrices, seq, d, device="cuda", dtype=torch.bfloat16,
                           generator=generator) for _ in range(3))
    sections = {}
    for order in ORDERS:
        use_order(order)
        sections[order] = tile_order.section_matrices(matrices, seq, d, 2, q.device)
    orders = ORDERS if sections["library"] != matrices else ORDERS[:1]
    graphs: dict[tuple[str, str], torch.cuda.CUDAGraph] = {}
    outputs = {}
    for order in orders:
        use_order(order)
        timed = kernels(q, k, v)
        outputs[order] = poisoned_outputs(timed)
        graphs |= {(order, name): graphed(fn) for name, fn in timed.items()}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        graphs[("cudnn", "forward")] = graphed(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    identical = all(
        all(torch.equal(a, b) and not a.isnan().any() for a, b in
            zip(outputs[orders[-1]][name], outputs[orders[0]][name], strict=True))
        for name in outputs[orders[0]])
    ms: dict[str, list[float]] = {f"{order}: {name}": [] for order, name in graphs}
    for _ in range(ROUNDS):
        for (order, name), graph in graphs.items():
            ms[f"{order}: {name}"].append(bench_ms(graph.replay))
    use_order("library")
    return {"shape": list(shape), "sections_of": sections["library"],
            "identical": identical, "ms_per_round": ms}


def summary(row: dict[str, object]) -> str:
    ms = row["ms_per_round"]
    parts = [f"{'x'.join(map(str, row['shape']))} ({row['sections_of']} per section)",
             f"cuDNN fwd {statistics.median(ms['cudnn: forward']):.3f}"]
    for key, rounds in ms.items():
        if key.startswith("library: "):
            base = ms[key.replace("library: ", "one section: ")]
            ratios = [a / b for a, b in zip(rounds, base, strict=True)]
            parts.append(f"{key[9:]} {statistics.median(ratios):.3f}")
    return " | ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write DIR/tile_order.json")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure_shapes(SHAPES, measure, run_record(args.commit, ROUNDS, []),
                          args.out / "tile_order.json", summary)
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
