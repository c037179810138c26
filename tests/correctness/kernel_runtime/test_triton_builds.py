"""Our Triton kernels build for every GPU target our users have (sm_80 .. sm_120), on any
machine, GPU or not, through Triton's ahead-of-time compiler (`systems check-builds`): the
flash attention kernels at the tile configs their dispatch picks on each target, fitting its
shared memory and registers per block, the fused AdamW kernel, and the Gluon kernels on
sm_90.

The full sweep (every dtype and head dim on every target, `systems check-builds`) takes
too long for CI on two cores: these tests build a representative subset, on each target
the cases whose measured tiles overflowed some target before configs followed the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import systems
from systems.common.hardware import TARGETS, GpuTarget
from systems.kernel_runtime.triton_build import HOPPER_SHARED_BYTES, overflow


def _run(*args: str) -> subprocess.CompletedProcess:
    """`python *args` run with the kernels compiled, not interpreted, and this checkout
    importable."""
    src = str(Path(systems.__file__).parents[1])
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=1500)


def _built(*args: str) -> dict:
    """The JSON that `python *args` prints last (it must succeed)."""
    result = _run(*args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


# (target, dtype, head dim): fp32 at d = 64 overflowed an A100's dQ and every 99 KiB
# target; bf16 at d = 128 an RTX 5090's. On sm_90 they also build what the small-GPU
# switch picks there.
REPRESENTATIVE = [("sm_80", "fp32", 64), ("sm_80", "bf16", 128), ("sm_86", "fp32", 64),
                  ("sm_89", "fp32", 128), ("sm_89", "bf16", 128), ("sm_90", "bf16", 128),
                  ("sm_90", "fp32", 64), ("sm_120", "bf16", 128), ("sm_120", "fp32", 64)]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "dtype", "head_dim"), REPRESENTATIVE)
def test_check_builds_passes_for_each_target(arch, dtype, head_dim):
    result = _run("-m", "systems", "check-builds", "--arch", arch, "--kernels", "attention",
                  "--dtype", dtype, "--head-dim", str(head_dim), "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and all(row["target"] == arch and not row["over"] for row in rows), rows
    for row in rows:
        assert set(row["kernels"]) == {"forward", "dq", "dkdv"}
        assert all(0 < k["shared_bytes"] <= TARGETS[arch].shared_bytes
                   for k in row["kernels"].values()), row
    if arch == "sm_90" and dtype == "bf16":  # the switch's picks are built there too
        assert any(row["config"].endswith("-as-sm_120") for row in rows), rows


def test_overflow_names_shared_memory_and_registers_beyond_the_target():
    small = GpuTarget((8, 9), 101376)
    assert overflow(small, {"shared_bytes": 101376, "registers": 128}, num_warps=16) == []
    found = overflow(small, {"shared_bytes": 101377, "registers": 255}, num_warps=16)
    assert len(found) == 2 and "shared memory" in found[0] and "registers" in found[1]


def test_the_check_sees_tiles_that_do_not_fit():
    """fp32 at d = 128 with half precision's large tiles: the three-TF32 operand splits
    need more shared memory than a Hopper block has, which the check must report."""
    built = _built("-c", (
        "import json, torch\n"
        "from systems.attention.flash_triton import compile_check, configs\n"
        "tiles = configs._tiles((128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3))\n"
        "print(json.dumps(compile_check.build(128, torch.float32, tiles)))\n"))
    assert all(kernel["shared_bytes"] > HOPPER_SHARED_BYTES for kernel in built.values()), built


@pytest.mark.slow
def test_fused_adamw_kernel_builds_for_every_target():
    """bf16 and fp16 parameters and gradients, addresses aligned or not (`ALIGNED`), and
    bf16 parameters over split masters (`SPLIT_MASTER`), on each target."""
    result = _run("-m", "systems", "check-builds", "--kernels", "adamw", "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {row["target"] for row in rows} == set(TARGETS)
    assert len(rows) == 6 * len(TARGETS) and not any(row["over"] for row in rows)


# Stack bytes per thread a config may keep (see the test below).
SCALAR_STACK_BYTES = 64
# FA3's order of a tile's last matmuls (`dq_first`) keeps dQ's fragment live beside dK's and
# dV's: at d = 128 ptxas keeps 48 bytes on the stack under Triton 3.6 (the GPU image's, with
# which the order measured faster) and 112 under Triton 3.8, both under one tile fragment.
DQ_FIRST_STACK_BYTES = 128


@pytest.mark.parametrize(("module", "configs", "stack_bytes"),
                         [("backward", 8, SCALAR_STACK_BYTES), ("forward", 1, 0)],
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
    S^T's. The forward keeps nothing on the stack."""
    built = _built("-c", (
        "import json\n"
        f"from systems.attention.gluon import {module}\n"
        "print(json.dumps({str(key): "
        f"{{**{module}.build(key[0] if isinstance(key, tuple) else key, config),\n"
        "                   'dq_first': getattr(config, 'dq_first', False)}\n"
        f"                  for key, config in {module}.CONFIGS.items()}}))\n"))
    assert len(built) == configs, built
    for kernel in built.values():
        bound = DQ_FIRST_STACK_BYTES if kernel["dq_first"] else stack_bytes
        assert 0 < kernel["shared_bytes"] <= HOPPER_SHARED_BYTES, built
        assert kernel.get("stack_bytes", 0) <= bound, built
        assert {24, 240} <= set(kernel["setmaxnreg"]), built
