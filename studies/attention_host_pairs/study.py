"""Host cost of an eager forward + backward for each of our kernel pairs beside SDPA's.

    PYTHONPATH=src python -m studies.attention_host_pairs.study [--calls 200] [--rounds 7]

For each shape (bf16, causal, packed q, k, v) and implementation of the registry, rounds
taken in turn: the host's time to queue `calls` back-to-back forward + backward calls
(perf_counter, no sync inside) and the wall time of the same burst once the GPU has
finished it, each per call, median over rounds. An implementation is host-bound at a shape
where its queueing time is close to its wall time. Prints one table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from systems.attention import get_attention, unsupported_reason
from systems.attention.host_path import replay

SHAPES = ((8, 16, 1024, 64), (16, 1, 4096, 64), (16, 1, 2048, 128), (8, 16, 1024, 128))
IMPLEMENTATIONS = ("triton", "triton_gluon_bwd", "triton_gluon_bwd_unordered",
                   "sdpa_cudnn", "sdpa_flash")


def burst(step: Callable[[], None], calls: int) -> tuple[float, float]:
    """(host queueing, wall) per call, us."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    queued = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return queued / calls * 1e6, wall / calls * 1e6


def forward_backward(name: str, shape: tuple[int, ...]) -> Callable[[], None]:
    attend = get_attention(name)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def step() -> None:
        torch.autograd.grad(attend(*leaves, is_causal=True), leaves, do)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'shape':>18} {'implementation':>28} {'host us':>9} {'wall us':>9} {'replayed':>9}")
    for shape in SHAPES:
        steps = {name: forward_backward(name, shape) for name in IMPLEMENTATIONS
                 if unsupported_reason(name, device, torch.bfloat16, shape[-2]) is None}
        for step in steps.values():  # compile, tune, keep replay programs
            for _ in range(3):
                step()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
        served: dict[str, int] = dict.fromkeys(steps, 0)
        for _ in range(args.rounds):
            for name, step in steps.items():
                before = replay.replays()
                times[name].append(burst(step, args.calls))
                served[name] += replay.replays() - before
        for name, rounds in times.items():
            host = statistics.median(t[0] for t in rounds)
            wall = statistics.median(t[1] for t in rounds)
            per_call = served[name] / (args.rounds * args.calls)
            print(f"{'x'.join(map(str, shape)):>18} {name:>28} {host:9.0f} {wall:9.0f} "
                  f"{per_call:9.1f}")


if __name__ == "__main__":
    main()
