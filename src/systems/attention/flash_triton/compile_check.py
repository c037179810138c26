"""`TRITON_INTERPRET=0 python -m systems.attention.flash_triton.compile_check`: build the
kernels for Hopper on any machine.

Triton compiles for a named target without a GPU. This builds the forward, dQ and dK/dV
kernels at every tile config `launch.py` can pick and reports each build's shared memory
against sm_90's limit per block, so a kernel that no longer compiles for the GPU, or a
config that could not launch there, shows up on a machine without one (the correctness
suite runs it on the CPU). It also reports each build's registers per thread and stack
bytes per thread (where register spills go), read from the binary by the `cuobjdump` that
ships with Triton. What it cannot see: speed, and the numbers the kernels compute (the
interpreter tests those). The builds are this Triton's: another version builds otherwise.

The kernels must be compiled, not interpreted, in this process: TRITON_INTERPRET=0 has to be
set before Python starts (CPU-only PyTorch turns the interpreter on otherwise).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from systems.attention.flash_triton import launch
from systems.attention.flash_triton.kernels import (
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_forward_kernel,
)
from systems.common.cli_help import HelpFormatter
from systems.triton_runtime import INTERPRETED

HOPPER = GPUTarget("cuda", 90, 32)
# The most dynamic shared memory one block may use on sm_90 (H100, H200): 227 KiB.
HOPPER_SHARED_BYTES = 232448
# A length no tile divides, so that the kernels build their masked paths.
_SEQ = 1000
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_SIZE_ARGS = ("n_heads", "n_q", "n_k")
_FP32_POINTERS = ("L", "Delta")
_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def configured() -> dict[str, tuple[int, torch.dtype, launch.FlashConfig]]:
    """Every tile config `launch.default_config` can pick, by label: (head dim, dtype,
    config). The few-program tiles serve every half-precision head dim: they are built at
    the largest."""
    rows = {f"half-d{d}": (d, torch.bfloat16, config)
            for d, config in launch._HALF_CONFIGS.items()}
    rows |= {f"half-d{d}-own": (d, torch.bfloat16, config)
             for d, config in launch._HALF_HEAD_DIM_CONFIGS.items()}
    rows["half-few-programs"] = (launch.MAX_HEAD_DIM, torch.bfloat16,
                                 launch._HALF_FEW_PROGRAM_CONFIG)
    rows |= {f"fp32-d{d}": (d, torch.float32, config)
             for d, config in launch._FP32_CONFIGS.items()}
    return rows


def _signature(kernel: triton.JITFunction, dtype: torch.dtype, constexprs: dict[str, object],
               tiles: launch.TileConfig, block_d: int) -> dict[str, str]:
    """Triton's type for each parameter, as launch.py passes them: 32-bit sizes and strides,
    fp32 L and Delta, K/V descriptors walking key tiles, Q/dO descriptors query tiles."""
    element = _TRITON_TYPES[dtype]
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name.startswith("stride_") or name in _SIZE_ARGS:
            types[name] = "i32"
        elif name.endswith("_tiles"):
            rows = tiles.block_n if name[0] in "kv" else tiles.block_m
            types[name] = f"tensordesc<{element}[1, 1, {rows}, {block_d}]>"
        else:
            types[name] = f"*{'fp32' if name in _FP32_POINTERS else element}"
    return types


def _resources(cubin: bytes) -> dict[str, int]:
    """Registers and stack bytes per thread of a binary; empty where cuobjdump is missing
    or does not say (the report only, never the check, depends on it)."""
    if not _CUOBJDUMP.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as binary:
        binary.write(cubin)
        binary.flush()
        usage = subprocess.run([str(_CUOBJDUMP), "-res-usage", binary.name],
                               capture_output=True, text=True).stdout
    found = dict(re.findall(r"\b(REG|STACK):(\d+)", usage))
    if found.keys() != {"REG", "STACK"}:
        return {}
    return {"registers": int(found["REG"]), "stack_bytes": int(found["STACK"])}


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
         {"CHECK_Q_ROWS": _SEQ % config.backward_dkdv.block_m != 0}),
    )
    built = {}
    for name, kernel, tiles, extra in kernels:
        constexprs = problem.constexprs(tiles, **extra)
        signature = _signature(kernel, dtype, constexprs, tiles, problem.block_d)
        # Every pointer a launcher passes is 16-byte aligned (`KernelLauncher`).
        aligned = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]]
                   for arg, kind in signature.items() if kind.startswith("*")}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, aligned),
                                  target=HOPPER, options={"num_warps": tiles.num_warps,
                                                          "num_stages": tiles.num_stages})
        built[name] = {"shared_bytes": compiled.metadata.shared,
                       **_resources(compiled.asm["cubin"])}
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
