"""Our Triton kernels build for Hopper (sm_90), on any machine, GPU or not, through Triton's
ahead-of-time compiler (`systems.kernel_runtime.triton_build`): the flash attention kernels at
every tile config `launch.py` can pick, fitting sm_90's shared memory per block, and the
fused AdamW kernel for the dtypes its optimizer launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import systems
from systems.attention.flash_triton.compile_check import configured
from systems.kernel_runtime.triton_build import HOPPER_SHARED_BYTES


def _built(*args: str) -> dict:
    """The JSON that `python *args` prints last, run with the kernels compiled, not
    interpreted, and this checkout importable."""
    src = str(Path(systems.__file__).parents[1])
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("config", sorted(configured()))
def test_kernels_build_for_hopper_and_fit_its_shared_memory(config):
    built = _built("-m", "systems.attention.flash_triton.compile_check", "--config", config,
                   "--json")["kernels"]
    assert set(built) == {"forward", "dq", "dkdv"}
    shared = {name: kernel["shared_bytes"] for name, kernel in built.items()}
    assert all(0 < size <= HOPPER_SHARED_BYTES for size in shared.values()), shared


def test_the_check_sees_tiles_that_do_not_fit():
    """fp32 at d = 128 with half precision's large tiles: the three-TF32 operand splits
    need more shared memory than a Hopper block has, which the check must report."""
    built = _built("-c", (
        "import json, torch\n"
        "from systems.attention.flash_triton import compile_check, launch\n"
        "tiles = launch._tiles((128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3))\n"
        "print(json.dumps(compile_check.build(128, torch.float32, tiles)))\n"))
    assert all(kernel["shared_bytes"] > HOPPER_SHARED_BYTES for kernel in built.values()), built


def test_fused_adamw_kernel_builds_for_hopper():
    """bf16 and fp16 parameters and gradients, addresses aligned or not (`ALIGNED`), and
    bf16 parameters over split masters (`SPLIT_MASTER`)."""
    built = _built("-c", (
        "import json\n"
        "import triton.language as tl\n"
        "from systems.optim.adamw_kernel import BLOCK_SIZE, NUM_WARPS, _adamw_kernel\n"
        "from systems.kernel_runtime.triton_build import build_for_hopper\n"
        "pointers = {'block_tensor': '*i32', 'block_start': '*i64', 'addresses': '*i64',\n"
        "            'numels': '*i64', 'corrections': '*fp32'}\n"
        "scalars = {'num_tensors': 'i32', **dict.fromkeys(\n"
        "    ('lr', 'beta1', 'beta2', 'eps', 'weight_decay'), 'fp32')}\n"
        "built = {}\n"
        "for name, dtype, split in (('bf16', tl.bfloat16, False), ('fp16', tl.float16, False),\n"
        "                           ('bf16-split', tl.bfloat16, True)):\n"
        "    for aligned in (True, False):\n"
        "        constexprs = {'PARAM_DTYPE': dtype, 'GRAD_DTYPE': dtype, 'ALIGNED': aligned,\n"
        "                      'SPLIT_MASTER': split, 'BLOCK_SIZE': BLOCK_SIZE}\n"
        "        signature = {**pointers, **scalars, **dict.fromkeys(constexprs, 'constexpr')}\n"
        "        built[f'{name}-{aligned}'] = build_for_hopper(\n"
        "            _adamw_kernel, signature, constexprs, num_warps=NUM_WARPS, num_stages=3)\n"
        "print(json.dumps(built))\n"))
    assert len(built) == 6
    assert all(0 <= kernel["shared_bytes"] <= HOPPER_SHARED_BYTES for kernel in built.values())


@pytest.mark.parametrize(("module", "configs", "stack_bytes"),
                         [("backward", 4, 64), ("forward", 1, 0)],
                         ids=["backward", "forward"])
def test_gluon_kernels_build_for_hopper_and_fit_their_shared_memory(module, configs,
                                                                    stack_bytes):
    """The Gluon backward and forward at each config the library launches: each fits a
    block's shared memory, spills no tensor, and its warp-specialised partitions set their
    registers (the producer, and the backward's writers, give theirs to the consumers).
    Where dK and dV fill the backward's consumer registers, ptxas may park a few scalars
    (loop bounds, addresses) on the stack: Triton 3.8 does, 40 bytes, in the ordered
    alternating config at d = 64 with 128-row tiles (Triton 3.6, the GPU image's, none). A
    spilled fragment of a tile would take far more: 64 registers, 256 bytes, for one of
    S^T's."""
    built = _built("-c", (
        "import json\n"
        f"from systems.attention.gluon import {module}\n"
        "print(json.dumps({str(key): "
        f"{module}.build(key[0] if isinstance(key, tuple) else key, config)\n"
        f"                  for key, config in {module}.CONFIGS.items()}}))\n"))
    assert len(built) == configs, built
    for kernel in built.values():
        assert 0 < kernel["shared_bytes"] <= HOPPER_SHARED_BYTES, built
        assert kernel.get("stack_bytes", 0) <= stack_bytes, built
        assert {24, 240} <= set(kernel["setmaxnreg"]), built
