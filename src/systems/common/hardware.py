"""What machine we run on: device names, library versions, nominal peak throughput."""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GpuModel:
    """A GPU model's dense (no sparsity) datasheet peaks in TFLOP/s, tensor-core rates with
    fp32 accumulation (what our kernels and PyTorch's matmuls use; GeForce cards run fp16
    accumulation twice as fast). "fp32" is the non-tensor-core rate, which fp32 matmuls get
    unless TF32 is enabled. `names`: the full names CUDA reports for it."""

    model: str
    names: str  # a regular expression matched against the whole name
    bf16: float
    tf32: float
    fp32: float

    def peak(self, precision: str) -> float | None:
        rates = {"bf16": self.bf16, "fp16": self.bf16, "tf32": self.tf32, "fp32": self.fp32}
        return rates.get(precision)


# Whole names, so that no card takes another's peaks: an H100 PCIe is not an H100 SXM,
# an L40 not an L40S, an RTX 4090 D not an RTX 4090.
GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("A100 40GB", r"NVIDIA A100-(SXM4|PCIE)-40GB", 312.0, 156.0, 19.5),
    GpuModel("A100 80GB", r"NVIDIA A100-(SXM4|PCIE)-80GB|NVIDIA A100 80GB PCIe",
             312.0, 156.0, 19.5),
    GpuModel("H100 SXM", r"NVIDIA H100 80GB HBM3|NVIDIA H100 SXM5 80GB", 989.4, 494.7, 66.9),
    GpuModel("H100 PCIe", r"NVIDIA H100 PCIe", 756.5, 378.0, 51.2),
    GpuModel("H100 NVL", r"NVIDIA H100 NVL", 835.5, 417.5, 60.0),
    GpuModel("H200", r"NVIDIA H200|NVIDIA H200 141GB HBM3e", 989.4, 494.7, 66.9),
    GpuModel("H200 NVL", r"NVIDIA H200 NVL", 835.5, 417.5, 60.0),
    GpuModel("H800", r"NVIDIA H800|NVIDIA H800 80GB HBM3", 989.4, 494.7, 66.9),
    GpuModel("H800 PCIe", r"NVIDIA H800 PCIe", 756.5, 378.0, 51.2),
    GpuModel("L40S", r"NVIDIA L40S", 362.1, 183.0, 91.6),
    GpuModel("RTX 4090", r"NVIDIA GeForce RTX 4090", 165.2, 82.6, 82.6),
    GpuModel("RTX 5090", r"NVIDIA GeForce RTX 5090", 209.5, 104.8, 104.8),
)


def gpu_model(name: str) -> GpuModel | None:
    """The model whose reported names include `name` exactly; None for any other card."""
    for model in GPU_MODELS:
        if re.fullmatch(model.names, name.strip()):
            return model
    return None


@dataclass(frozen=True)
class GpuTarget:
    """What kernel configs are chosen by: a GPU's compute capability, the most shared
    memory one block may use (the opt-in maximum), its 32-bit registers per block, and its
    SM count and L2 bytes (None for a target, which has no fixed count or size)."""

    capability: tuple[int, int]
    shared_bytes: int
    registers: int = 65536
    sm_count: int | None = None
    l2_bytes: int | None = None

    @property
    def arch(self) -> str:
        """Triton's and CUDA's name for the target: 'sm_89'."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


# The targets our users' GPUs are (CUDA's per-block opt-in limits): A100 (sm_80), RTX
# 3090 and A6000 (sm_86), RTX 4090 and L40S (sm_89), H100, H200 and H800 (sm_90), RTX 5090
# (sm_120).
TARGETS: dict[str, GpuTarget] = {target.arch: target for target in (
    GpuTarget((8, 0), 166912),
    GpuTarget((8, 6), 101376),
    GpuTarget((8, 9), 101376),
    GpuTarget((9, 0), 232448),
    GpuTarget((12, 0), 101376),
)}
# The target whose configs were measured (H100, H200), and which the CPU's interpreter
# takes unless the switch below names another.
MEASURED_TARGET = TARGETS["sm_90"]
# The small-GPU switch: SYSTEMS_GPU_LIMITS=sm_89 makes every config choice see that
# target's capability and shared memory (the GPU's own SM count stays), so that a big
# GPU runs the configs a small one would pick.
GPU_LIMITS_ENV = "SYSTEMS_GPU_LIMITS"


def emulated_target() -> GpuTarget | None:
    """The target the small-GPU switch names; None when it is off."""
    arch = os.environ.get(GPU_LIMITS_ENV, "").strip()
    if not arch:
        return None
    if arch not in TARGETS:
        raise ValueError(f"{GPU_LIMITS_ENV}={arch!r}: name one of {sorted(TARGETS)}")
    return TARGETS[arch]


def device_target(device: torch.device | str | None = None) -> GpuTarget:
    """The limits kernel configs are chosen for on `device` (default: the current GPU): the
    GPU's own, or under the small-GPU switch its target's, smaller of the two, with the
    GPU's SM count and L2. The CPU (Triton's interpreter) takes the switch's target, else the
    measured one."""
    emulated = emulated_target()
    device = torch.device(device if device is not None else
                          "cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        return emulated or MEASURED_TARGET
    own = _cuda_target(torch.cuda.current_device() if device.index is None else device.index)
    if emulated is None:
        return own
    return GpuTarget(emulated.capability, min(emulated.shared_bytes, own.shared_bytes),
                     min(emulated.registers, own.registers), own.sm_count, own.l2_bytes)


def capability(device: torch.device | str | None = None) -> tuple[int, int]:
    """The compute capability configs are chosen for (`device_target`)."""
    return device_target(device).capability


def shared_bytes_per_block(device: torch.device | str | None = None) -> int:
    """The shared memory per block configs are chosen for (`device_target`)."""
    return device_target(device).shared_bytes


@functools.cache
def _cuda_target(index: int) -> GpuTarget:
    """The GPU's own limits, as Triton's launcher checks them."""
    import triton  # a CUDA torch on Linux comes with it

    props = triton.runtime.driver.active.utils.get_device_properties(index)
    capability = torch.cuda.get_device_capability(index)
    return GpuTarget(capability, props["max_shared_mem"], props["max_num_regs"],
                     props["multiprocessor_count"],
                     torch.cuda.get_device_properties(index).L2_cache_size)


# What the CPU (Triton's interpreter, or a build for a GPU) takes for the GPU's SMs and L2:
# the H100's.
MEASURED_SM_COUNT = 132
MEASURED_L2_BYTES = 50 * 2**20


def sm_count(device: torch.device | str | None = None) -> int:
    """The GPU's SM count (`device_target`); the CPU takes the H100's."""
    if not torch.cuda.is_available():
        return MEASURED_SM_COUNT
    return device_target(device).sm_count or MEASURED_SM_COUNT


def l2_bytes(device: torch.device | str | None = None) -> int:
    """The GPU's L2 cache in bytes (`device_target`); the CPU takes the H100's."""
    if not torch.cuda.is_available():
        return MEASURED_L2_BYTES
    return device_target(device).l2_bytes or MEASURED_L2_BYTES


def gpu_count() -> int:
    """CUDA devices visible to this process; 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_name(device: torch.device | str | None = None) -> str:
    """'NVIDIA H100 80GB HBM3', or the CPU's architecture when there is no GPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        return torch.cuda.get_device_name(device)
    return f"cpu-{platform.machine()}"


def slugify(text: str) -> str:
    """A file-system-safe form of `text`: runs of other characters become one '_'."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


def device_slug(device: torch.device | str | None = None) -> str:
    """A file-system-safe form of `device_name`, used to keep histories per GPU model."""
    return slugify(device_name(device))


def peak_tflops(precision: str, device: torch.device | str | None = None) -> float | None:
    """Nominal peak TFLOP/s of the device for `precision`, or None where unknown: the CPU,
    or a GPU not in GPU_MODELS (`peak_note` says which)."""
    model = gpu_model(device_name(device))
    return None if model is None else model.peak(precision)


def peak_note(device: torch.device | str | None = None) -> str:
    """Where MFU's peaks come from on this device, or why there is no MFU."""
    name = device_name(device)
    model = gpu_model(name)
    if model is not None:
        return f"MFU against the {model.model} datasheet's dense peaks"
    return f"no datasheet peak for {name!r}: MFU shown as -"


def software_versions() -> dict[str, str | None]:
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
    }


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it; None without one."""
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def cuda_library_versions() -> dict[str, str | None]:
    """Driver, CUDA runtime, cuDNN and NCCL versions torch runs with; None on CPU."""
    if not torch.cuda.is_available():
        return {"driver": None, "cuda_runtime": None, "cudnn": None, "nccl": None}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        nccl: str | None = ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        nccl = None
    return {
        "driver": driver_version(),
        # torch.version.cuda is the runtime torch was built with and ships (and loads).
        "cuda_runtime": torch.version.cuda,
        "cudnn": None if cudnn is None else str(cudnn),
        "nccl": nccl,
    }


def machine_description(device: torch.device | str | None = None) -> dict[str, object]:
    """Device and versions, as stored with every benchmark result."""
    info: dict[str, object] = {"device_name": device_name(device), **software_versions(),
                               **cuda_library_versions()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu_count=gpu_count(),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_multiprocessors=props.multi_processor_count,
        )
    return info
