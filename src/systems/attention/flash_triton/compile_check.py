"""`TRITON_INTERPRET=0 python -m systems.attention.flash_triton.compile_check`: build the
kernels for a GPU target on any machine.

Builds the forward, dQ and dK/dV kernels at every tile config `configs.config_for` can pick
on a target (`systems.kernel_runtime.triton_build`) and reports each build's shared memory
per block, registers and stack bytes per thread; exits 1 when a build does not fit the
target. What it cannot see: speed, and the numbers the kernels compute (the interpreter
tests those). The builds are this Triton's: another version builds otherwise.
`systems check-builds` runs it for every target, with the other kernels.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton

from systems.attention.flash_triton import configs, launch
from systems.attention.flash_triton.kernels import (
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_forward_kernel,
)
from systems.common.cli_help import HelpFormatter
from systems.common.hardware import TARGETS, GpuTarget
from systems.kernel_runtime.interpreter import INTERPRETED
from systems.kernel_runtime.triton_build import build_for, overflow

# The head dims the suite runs: powers of two from 16 to 128, the 2.7b model's 80, and 96,
# which splits into 64 + 32 columns.
HEAD_DIMS = (16, 32, 64, 80, 96, 128)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# A length no tile divides, so that the kernels build their masked paths.
_SEQ = 1000
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_SIZE_ARGS = ("n_heads", "n_q", "n_k", "group")
_FP32_POINTERS = ("L", "Delta")


def configured(target: GpuTarget = TARGETS["sm_90"], head_dims: tuple[int, ...] = HEAD_DIMS,
               dtypes: tuple[str, ...] = tuple(DTYPES)
               ) -> dict[str, tuple[int, torch.dtype, configs.FlashConfig]]:
    """Every tile config `configs.config_for` can pick on `target`, by label: (head dim,
    dtype, config). On sm_90 that includes what the small-GPU switch makes it pick (it
    runs those configs there)."""
    picks = {target.arch: target}
    if configs.is_measured(target):
        picks |= TARGETS
    rows = {}
    for arch, chosen_for in picks.items():
        chosen = configs.configs_for(chosen_for, head_dims, tuple(DTYPES[n] for n in dtypes))
        for (d, dtype), options in chosen.items():
            for index, config in enumerate(options):
                if (d, dtype, config) not in rows.values():
                    suffix = "" if arch == target.arch else f"-as-{arch}"
                    label = f"{_TRITON_TYPES[dtype]}-d{d}{'-few' if index else ''}{suffix}"
                    rows[label] = (d, dtype, config)
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


def build(head_dim: int, dtype: torch.dtype, config: launch.FlashConfig,
          target: GpuTarget = TARGETS["sm_90"]) -> dict[str, dict[str, int]]:
    """Per kernel built for `target` with `config` (causal): shared memory in bytes per
    block, and registers and stack bytes per thread where cuobjdump can tell."""
    problem = launch._Problem(1, 1, _SEQ, _SEQ, head_dim, dtype, torch.device("cuda"), True,
                              config)
    kernels = (
        ("forward", flash_forward_kernel, config.forward, problem.forward_constexprs()),
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
        built[name] = build_for(target, kernel, signature, constexprs,
                                num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return built


def check(target: GpuTarget, labels: list[str] | None = None, *,
          head_dims: tuple[int, ...] = HEAD_DIMS, dtypes: tuple[str, ...] = tuple(DTYPES),
          as_json: bool = False) -> int:
    """Build each config for `target`, print a line per config; the number of kernels that
    do not fit it."""
    rows = configured(target, head_dims, dtypes)
    over = 0
    if not as_json:
        print(f"Triton {triton.__version__}, {target.arch}: shared memory per block (limit "
              f"{target.shared_bytes / 1024:.0f} KiB), registers and stack bytes per thread")
    for label in labels or list(rows):
        d, dtype, config = rows[label]
        built = build(d, dtype, config, target)
        tiles = {"forward": config.forward, "dq": config.backward_dq,
                 "dkdv": config.backward_dkdv}
        problems = {name: overflow(target, kernel, tiles[name].num_warps)
                    for name, kernel in built.items()}
        over += sum(bool(found) for found in problems.values())
        if as_json:
            print(json.dumps({"config": label, "target": target.arch, "kernels": built,
                              "triton": triton.__version__,
                              "over": {k: v for k, v in problems.items() if v}}), flush=True)
        else:
            print(f"{label}: " + "; ".join(
                f"{name} {kernel['shared_bytes'] / 1024:.0f} KiB"
                + "".join(f", {kernel[key]} {unit}" for key, unit in
                          (("registers", "regs"), ("stack_bytes", "B stack")) if key in kernel)
                + "".join(f" OVER: {problem}" for problem in problems[name])
                for name, kernel in built.items()), flush=True)
    return over


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m systems.attention.flash_triton.compile_check",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--arch", choices=sorted(TARGETS), default="sm_90")
    parser.add_argument("--config", action="append",
                        help="a label the full run prints; repeatable (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per config")
    args = parser.parse_args(argv)
    if INTERPRETED:
        parser.error("the kernels are interpreted here: run with TRITON_INTERPRET=0")
    target = TARGETS[args.arch]
    unknown = set(args.config or ()) - configured(target).keys()
    if unknown:
        parser.error(f"no config {sorted(unknown)} on {args.arch}")
    return 1 if check(target, args.config, as_json=args.json) else 0


if __name__ == "__main__":
    sys.exit(main())
