"""Building and loading a C++ extension of ours with the system's C++ compiler.

One source file becomes one Python module, built against the running PyTorch with a
single `c++` call (no ninja, no CUDA toolkit: our extensions call the CUDA driver through
`dlopen`, with the `cuda.h` that ships with Triton). The module is kept under
`$SYSTEMS_CACHE_DIR` (default `~/.cache/systems`) in a folder named by a hash of its source,
the compiler flags and the PyTorch and Python versions, so a machine builds each version
once and versions never overwrite each other.

Every way a build or a load can fail ends in NativeBuildError, whose message says why and
what to change, so callers can fall back. Loading a damaged shared object can kill the
process (SIGBUS on a truncated file) before any exception, so each module has a record of
its size and SHA-256 beside it, written after the module is renamed into place; a module
whose record is missing or disagrees is rebuilt, never loaded. Builders of one version take
an flock on the version's folder (released by the kernel when a builder dies, unlike a lock
file that a killed build leaves behind), so one compiles while the others wait, and the
holder removes scratch folders that killed builds left.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import IO

import torch
from torch.utils import cpp_extension

_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
_CACHE_HINT = "set SYSTEMS_CACHE_DIR to a writable folder"


class NativeBuildError(RuntimeError):
    """The extension could not be built or loaded; the message says why and how to fix it."""


def cache_dir() -> Path:
    root = os.environ.get("SYSTEMS_CACHE_DIR") or Path.home() / ".cache" / "systems"
    return Path(root) / "extensions"


def _triton_cuda_include() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "include"


def _compiler() -> list[str]:
    chosen = os.environ.get("CXX")
    if chosen:
        argv = shlex.split(chosen)  # "ccache c++" is a compiler too
        if not argv or shutil.which(argv[0]) is None:
            raise NativeBuildError(f"CXX={chosen!r} names no program that can run: "
                                   "set CXX to a C++ compiler, or unset it to use c++")
        return argv
    found = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if found is None:
        raise NativeBuildError("no C++ compiler found: install g++ (or set CXX to one)")
    return [found]


def _compile_command(name: str, source: Path, output: Path) -> list[str]:
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
    return [*_compiler(), "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
            *defines, *(f"-I{path}" for path in includes), str(source),
            f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}",
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", str(output)]


def _tag(name: str, source: Path) -> str:
    try:
        digest = hashlib.sha256(source.read_bytes())
    except OSError as error:
        raise NativeBuildError(f"cannot read {source}: {error.strerror}") from error
    for part in (*_compile_command(name, source, Path("out")), torch.__version__, sys.version):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _record(module: Path) -> Path:
    return module.with_name(module.name + ".sha256")


def _fingerprint(module: Path) -> str:
    return f"{module.stat().st_size} {hashlib.sha256(module.read_bytes()).hexdigest()}"


def _intact(module: Path) -> bool:
    """The module is there and is the file its build wrote (size and digest agree)."""
    try:
        return _record(module).read_text().strip() == _fingerprint(module)
    except OSError:
        return False


def _remove_scratch(folder: Path) -> None:
    """Scratch folders left by builds that were killed (call with the folder's lock held:
    no build is running there)."""
    for entry in folder.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _locked(folder: Path, blocking: bool) -> IO[str] | None:
    """The folder's lock file, locked (None: not blocking and another process holds it)."""
    handle = open(folder / ".lock", "a")  # noqa: SIM115 - held until the caller closes it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _compile(name: str, source: Path, output: Path) -> None:
    command = _compile_command(name, source, output)
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise NativeBuildError(f"cannot run the C++ compiler {command[0]}: {error.strerror}; "
                               "set CXX to a working C++ compiler") from error
    code = result.returncode
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        said = (result.stderr + result.stdout).strip()[-4000:] or "(it printed nothing)"
        raise NativeBuildError(f"building {name}: {command[0]} {how}: {said}\n"
                               "(set CXX to a working C++ compiler)")
    if not output.is_file() or output.stat().st_size == 0:
        raise NativeBuildError(f"building {name}: {command[0]} wrote no module")


def _build(name: str, source: Path, module: Path) -> None:
    folder = module.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = _locked(folder, blocking=True)
    except OSError as error:
        raise NativeBuildError(f"cannot write the extension cache {folder}: "
                               f"{error.strerror or error}; {_CACHE_HINT}") from error
    with lock:
        if _intact(module):  # another process built it while this one waited
            return
        try:
            _remove_scratch(folder)
            print(f"systems: building {name} from {source.name} (once per machine and "
                  "version)", file=sys.stderr, flush=True)
            scratch = Path(tempfile.mkdtemp(prefix="build-", dir=folder))
            try:
                built = scratch / module.name
                _compile(name, source, built)
                os.replace(built, module)
                record = scratch / "record"
                record.write_text(_fingerprint(module))
                os.replace(record, _record(module))  # last: the record vouches for the module
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        except OSError as error:
            raise NativeBuildError(f"writing {name} into {folder} failed: "
                                   f"{error.strerror or error}; {_CACHE_HINT}") from error


def _sweep(folder: Path) -> None:
    """Remove scratch folders of killed builds beside an intact module, when no build holds
    the folder and it is writable (a read-only cache is used as it is)."""
    try:
        if not any(entry.is_dir() for entry in folder.iterdir()):
            return
        lock = _locked(folder, blocking=False)
    except OSError:
        return
    if lock is not None:
        with lock:
            _remove_scratch(folder)


def load_extension(name: str, source: Path) -> ModuleType:
    """The module `name` built from the C++ file `source` (which defines it with
    `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`), built on first use and rebuilt when its
    cached file is damaged. Raises NativeBuildError when it cannot be built or loaded."""
    module = cache_dir() / f"{name}-{_tag(name, source)}" / f"{name}{_SUFFIX}"
    if _intact(module):
        _sweep(module.parent)
    else:
        _build(name, source, module)
    spec = importlib.util.spec_from_file_location(name, module)
    loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except (ImportError, OSError) as error:
        raise NativeBuildError(f"loading {module} failed: {error}; delete {module.parent} "
                               "to rebuild it") from error
    return loaded
