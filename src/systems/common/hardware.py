"""What machine we run on: device names, library versions, nominal peak throughput."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import torch

# Dense (no sparsity) datasheet peaks in TFLOP/s, SXM parts. "fp32" is the non-tensor-core
# rate, which is what fp32 matmuls get unless TF32 is enabled.
_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
}


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
    """Nominal peak TFLOP/s of the device for `precision`, or None if unknown (e.g. CPU)."""
    name = device_name(device)
    for key, peaks in _PEAK_TFLOPS.items():
        if key in name:
            return peaks.get(precision)
    return None


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
