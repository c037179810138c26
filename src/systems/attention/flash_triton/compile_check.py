"""`TRITON_INTERPRET=0 python -m systems.attention.flash_triton.compile_check`: build the
kernels for Hopper on any machine.

Builds the forward, dQ and dK/dV kernels at every tile config `launch.py` can pick
(`systems.kernel_runtime.triton_build`) and reports each build's shared memory against
sm_90's limit per block, registers and stack bytes per thread; exits 1 when a build does
not fit. What it cannot see: speed, and the numbers the kernels compute (the interpreter
tests those). The builds are this Triton's: another version builds otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton

from systems.attention.flash_triton import launch
from systems.attention.flash_triton.kernels import (
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_forward_kernel,
)
from systems.common.cli_help import HelpFormatter
from systems.kernel_runtime.interpreter import INTERPRETED
from systems.kernel_runtime.triton_build import HOPPER_SHARED_BYTES, build_for_hopper

# A length no tile divides, so that the kernels build their masked paths.
_SEQ = 1000
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_SIZE_ARGS = ("n_heads", "n_q", "n_k")
_FP32_POINTERS = ("L", "Delta")


def configured() -> dict[str, tuple[int, torch.dtype, launch.FlashConfig]]:
    """Every tile config `launch.default_config` can pick, by label: (head dim, dtype,
    config). The few-program tiles serve every half-precision head dim: they are built at
    the largest. d = 96 builds d = 128's tiles split into 64 + 32 columns (d = 80's own
    tiles build split too)."""
    rows = {f"half-d{d}": (d, torch.bfloat16, config)
            for d, config in launch._HALF_CONFIGS.items()}
    rows |= {f"half-d{d}-own": (d, torch.bfloat16, config)
             for d, config in launch._HALF_HEAD_DIM_CONFIGS.items()}
    rows["half-d96-split"] = (96, torch.bfloat16, launch.default_config(96, torch.bfloat16))
    rows["half-few-programs"] = (launch.MAX_HEAD_DIM, torch.bfloat16,
                                 launch._HALF_FEW_PROGRAM_CONFIG)
    rows |= {f"fp32-d{d}": (d, torch.float32, config)
             for d, config in launch._FP32_CONFIGS.items()}
    return rows


def _signature(kernel: triton.JITFunction, dtype: torch.dtype, constexprs: dict[str, object],
               tiles: launch.TileConfig, problem: launch._Problem) -> dict[str, str]:
    """Triton's type for each parameter, as launch.py passes them: 32-bit sizes and strides,
    fp32 L and Delta, K/V descriptors walking key tiles, Q/dO descriptors query tiles (a
    tail descriptor is None, a constexpr, unless the head dim splits)."""
    element = _TRITON_TYPES[dtype]
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name.startswith("stride_") or name in _SIZE_ARGS:
            types[name] = "i32"
        elif name.endswith("_tiles"):
            rows = tiles.block_n if name[0] in "kv" else tiles.block_m
            tail = name.endswith("_tail_tiles")
            width = problem.block_t if tail else problem.block_d
            types[name] = ("constexpr" if tail and not problem.split else
                           f"tensordesc<{element}[1, 1, {rows}, {width}]>")
        else:
            types[name] = f"*{'fp32' if name in _FP32_POINTERS else element}"
    return types


def build(head_dim: int, dtype: torch.dtype, config: launch.FlashConfig
          ) -> dict[str, dict[str, int]]:
    """Per kernel built for Hopper with `config` (causal): shared memory in bytes per block,
    and registers and stack bytes per thread where cuobjdump can tell."""
    problem = launch._Problem(1, 1, _SEQ, _SEQ, head_dim, dtype, torch.device("cuda"), True,
                              config)
    kernels = (
        ("forward", flash_forward_kernel, config.forward, {}),
        ("dq", flash_backward_dq_kernel, config.backward_dq, {}),
        ("dkdv", flash_backward_dkdv_kernel, config.backward_dkdv,
         problem.dkdv_constexprs(config.backward_dkdv)),
    )
    built = {}
    for name, kernel, tiles, extra in kernels:
        constexprs = problem.constexprs(tiles, **extra)
        signature = _signature(kernel, dtype, constexprs, tiles, problem)
        constexprs |= {arg: None for arg, kind in signature.items()
                       if kind == "constexpr" and arg not in constexprs}
        # Every pointer a launcher passes is 16-byte aligned (`KernelLauncher`), as
        # build_for_hopper assumes.
        built[name] = build_for_hopper(kernel, signature, constexprs,
                                       num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m systems.attention.flash_triton.compile_check",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--config", action="append", choices=sorted(configured()),
                        help="repeatable (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per config")
    args = parser.parse_args(argv)
    if INTERPRETED:
        parser.error("the kernels are interpreted here: run with TRITON_INTERPRET=0")
    rows = configured()
    over = 0
    if not args.json:
        print(f"Triton {triton.__version__}, sm_90; shared memory per block (limit "
              f"{HOPPER_SHARED_BYTES / 1024:.0f} KiB), registers and stack bytes per thread")
    for label in args.config or list(rows):
        built = build(*rows[label])
        over += sum(kernel["shared_bytes"] > HOPPER_SHARED_BYTES for kernel in built.values())
        if args.json:
            print(json.dumps({"config": label, "triton": triton.__version__, "kernels": built}),
                  flush=True)
        else:
            print(f"{label}: " + "; ".join(
                f"{name} {kernel['shared_bytes'] / 1024:.0f} KiB"
                + "".join(f", {kernel[key]} {unit}" for key, unit in
                          (("registers", "regs"), ("stack_bytes", "B stack")) if key in kernel)
                for name, kernel in built.items()), flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
