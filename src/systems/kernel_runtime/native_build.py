"""Building and loading a C++ extension of ours with the system's C++ compiler.

One source file becomes one Python module, built against the running PyTorch with a
single `c++` call (no ninja, no CUDA toolkit: our extensions call the CUDA driver through
`dlopen`, with the `cuda.h` that ships with Triton). The module is kept under
`$SYSTEMS_CACHE_DIR` (default `~/.cache/systems`) by a hash of its source, the compiler
flags and the PyTorch and Python versions, so a machine builds each version once; processes
that build at the same time each write their own file and rename it into place.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch
from torch.utils import cpp_extension


class NativeBuildError(RuntimeError):
    """The extension could not be built or loaded; the message has the compiler's output."""


def cache_dir() -> Path:
    root = os.environ.get("SYSTEMS_CACHE_DIR") or Path.home() / ".cache" / "systems"
    return Path(root) / "extensions"


def _triton_cuda_include() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "include"


def _compile_command(name: str, source: Path, output: Path) -> list[str]:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise NativeBuildError("no C++ compiler found (set CXX or install g++)")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"],
                str(_triton_cuda_include())]
    torch_lib = cpp_extension.library_paths()[0]
    # What torch's own extension builds pass, so pybind11 and the C++ ABI match torch's.
    defines = [f"-DTORCH_EXTENSION_NAME={name}",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    for flag in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(torch._C, f"_PYBIND11_{flag}", None)
        if value is not None:
            defines.append(f'-DPYBIND11_{flag}="{value}"')
    return [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
            *defines, *(f"-I{path}" for path in includes), str(source),
            f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}",
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", str(output)]


def _tag(name: str, source: Path) -> str:
    digest = hashlib.sha256(source.read_bytes())
    command = _compile_command(name, source, Path("out"))
    for part in (*command[1:], torch.__version__, sys.version):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def load_extension(name: str, source: Path) -> ModuleType:
    """The module `name` built from the C++ file `source` (which defines it with
    `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`), built on first use. Raises
    NativeBuildError when it cannot be built."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    directory = cache_dir() / f"{name}-{_tag(name, source)}"
    path = directory / f"{name}{suffix}"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        print(f"systems: building {name} from {source.name} (once per machine and version)",
              file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            built = Path(scratch) / path.name
            result = subprocess.run(_compile_command(name, source, built),
                                    capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise NativeBuildError(f"building {name} failed:\n{result.stderr[-4000:]}")
            os.replace(built, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise NativeBuildError(f"loading {path} failed: {error}") from error
    return module
