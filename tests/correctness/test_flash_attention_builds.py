"""The flash attention kernels build for Hopper (sm_90) at every tile config `launch.py` can
pick, and fit its shared memory per block: checked on any machine, GPU or not, through
Triton's ahead-of-time compiler (`systems.attention.flash_triton.compile_check`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import systems
from systems.attention.flash_triton.compile_check import HOPPER_SHARED_BYTES, configured


def _compiled_python(*args: str) -> subprocess.CompletedProcess:
    """Python with the kernels compiled, not interpreted, and this checkout importable."""
    src = str(Path(systems.__file__).parents[1])
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.parametrize("config", sorted(configured()))
def test_kernels_build_for_hopper_and_fit_its_shared_memory(config):
    result = _compiled_python("-m", "systems.attention.flash_triton.compile_check",
                              "--config", config, "--json")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    built = json.loads(result.stdout.splitlines()[-1])["kernels"]
    assert set(built) == {"forward", "dq", "dkdv"}
    shared = {name: kernel["shared_bytes"] for name, kernel in built.items()}
    assert all(0 < size <= HOPPER_SHARED_BYTES for size in shared.values()), shared


def test_the_check_sees_tiles_that_do_not_fit():
    """fp32 at d = 128 with half precision's large tiles: the three-TF32 operand splits
    need more shared memory than a Hopper block has, which the check must report."""
    result = _compiled_python("-c", (
        "import json, torch\n"
        "from systems.attention.flash_triton import compile_check, launch\n"
        "tiles = launch._tiles((128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3))\n"
        "print(json.dumps(compile_check.build(128, torch.float32, tiles)))\n"))
    assert result.returncode == 0, result.stderr[-4000:]
    built = json.loads(result.stdout.splitlines()[-1])
    assert all(kernel["shared_bytes"] > HOPPER_SHARED_BYTES for kernel in built.values()), built
