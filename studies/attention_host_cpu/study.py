"""Our attention's Python per call, on the CPU, with kernel launches stubbed out.

    PYTHONPATH=src python -m studies.attention_host_cpu.study [--rounds 15] [--calls 2000]

What a GPU run's host profile (studies/attention_host_profile/study.py) cannot separate from the
driver and the kernels: the host time of the launch code itself. Two medians over rounds of
back-to-back calls at 1x1024x64 fp16, causal:

- planning: `check_triton_inputs`, `flash_forward` and `flash_backward` (plan lookup,
  output allocations, descriptor objects), launches doing nothing;
- eager call: `torch.autograd.grad(FlashAttentionTriton.apply(q, k, v, True), ...)`, the
  same plus the autograd Function and engine.

Times depend on the CPU and on what else runs there: compare two commits by running this
for each, alternately, on one quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from systems.attention import FlashAttentionTriton
from systems.attention.flash_triton import launch
from systems.kernel_runtime import launcher

SHAPE = (1, 1, 1024, 64)


def median_us(step: Callable[[], object], rounds: int, calls: int) -> float:
    for _ in range(calls // 10):
        step()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(per_call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    launcher.KernelLauncher.__call__ = lambda self, *launch_args: None
    q, k, v = (torch.randn(SHAPE, dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn(SHAPE, dtype=torch.float16)

    def planning() -> object:
        launch.check_triton_inputs(q, k, v)
        o, lse = launch.flash_forward(q, k, v, True)
        return launch.flash_backward(q, k, v, o, lse, do, True)

    def eager_call() -> object:
        return torch.autograd.grad(FlashAttentionTriton.apply(q, k, v, True), (q, k, v), do)

    shape = "x".join(map(str, SHAPE))
    for name, step in (("planning", planning), ("eager call", eager_call)):
        print(f"{name}: {median_us(step, args.rounds, args.calls):.1f} us per forward + "
              f"backward ({shape} fp16 causal, launches stubbed)", flush=True)


if __name__ == "__main__":
    main()
