"""Building a Triton kernel for a GPU target (sm_80 .. sm_120) on a machine without that GPU.

Triton compiles for a named target without a device: `build_for` returns what the build
needs per block and per thread, so that a kernel that no longer compiles for a GPU, or a
configuration that could not launch there, shows up on any machine (`systems check-builds`,
and the correctness suite on the CPU). Registers and stack bytes per thread (spilled registers live
on the stack) are read from the binary with the `cuobjdump` that ships with Triton.

Kernels must be compiled, not interpreted, in the calling process: TRITON_INTERPRET=0 has
to be set before Python starts (CPU-only PyTorch turns the interpreter on otherwise).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

from systems.common.hardware import TARGETS, GpuTarget

# The most dynamic shared memory one block may use on sm_90 (H100, H200): 227 KiB.
HOPPER_SHARED_BYTES = TARGETS["sm_90"].shared_bytes
_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _resources(cubin: bytes) -> dict[str, int]:
    """Registers and stack bytes per thread of a binary; empty where cuobjdump is missing
    or does not say (only the report depends on it, never a check)."""
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


def build_for_hopper(kernel: triton.JITFunction, signature: dict[str, str],
                     constexprs: dict[str, object], *, num_warps: int, num_stages: int,
                     maxnreg: int | None = None) -> dict[str, int | list[int]]:
    """`build_for` sm_90 (H100, H200)."""
    return build_for(TARGETS["sm_90"], kernel, signature, constexprs, num_warps=num_warps,
                     num_stages=num_stages, maxnreg=maxnreg)


def build_for(target: GpuTarget, kernel: triton.JITFunction, signature: dict[str, str],
              constexprs: dict[str, object], *, num_warps: int, num_stages: int,
              maxnreg: int | None = None) -> dict[str, int | list[int]]:
    """Build `kernel` (a Triton or a Gluon JIT function) for `target` with Triton's type for
    each parameter (`signature`, e.g. "*bf16", "i32", "constexpr") and the constexprs'
    values; every pointer is taken as 16-byte aligned, as launches that specialise on
    alignment pass them. `maxnreg` caps registers per thread as the launch option does
    (warp-specialised kernels share the SM's registers out from it). Returns the shared
    memory per block in bytes ("shared_bytes"), where cuobjdump can tell, "registers" and
    "stack_bytes" per thread, and for a warp-specialised kernel the register counts its
    partitions set ("setmaxnreg")."""
    missing = set(kernel.arg_names) - signature.keys()
    if missing:
        raise ValueError(f"{kernel.__name__}: no type for {sorted(missing)}")
    signature = {name: signature[name] for name in kernel.arg_names}  # in parameter order
    aligned = {(index,): [["tt.divisibility", 16]]
               for index, kind in enumerate(signature.values()) if kind.startswith("*")}
    source = GluonASTSource if kernel.is_gluon() else ASTSource
    options: dict[str, int] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    major, minor = target.capability
    compiled = triton.compile(source(kernel, signature, constexprs, aligned),
                              target=GPUTarget("cuda", major * 10 + minor, 32), options=options)
    built: dict[str, int | list[int]] = {"shared_bytes": compiled.metadata.shared,
                                         **_resources(compiled.asm["cubin"])}
    partitions = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)",
                            compiled.asm["ptx"])
    if partitions:
        built["setmaxnreg"] = sorted({int(count) for count in partitions})
    return built


def overflow(target: GpuTarget, built: dict[str, int | list[int]], num_warps: int) -> list[str]:
    """What a build (`build_for`'s answer) needs beyond `target`'s limits: shared memory per
    block, or registers per block (registers per thread times its threads); empty when it
    fits. Spills (stack bytes) cost speed, not the launch, and are not counted."""
    found = []
    if built["shared_bytes"] > target.shared_bytes:
        found.append(f"shared memory {built['shared_bytes']} > {target.shared_bytes} bytes")
    registers = built.get("registers")
    if registers is not None and registers * 32 * num_warps > target.registers:
        found.append(f"registers {registers} x {32 * num_warps} threads > {target.registers}")
    return found
