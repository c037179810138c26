"""Building and loading our C++ extensions (`systems.kernel_runtime.native_build`) on a
machine as users have it: every way a build or a load can fail is a NativeBuildError whose
message says why, and a damaged cached module is rebuilt, never loaded.

The extension here is a plain Python C module (it builds in a second); the system's `c++`
builds it. Loading a truncated shared object can kill the process that loads it, so those
loads run in a child process.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from native_cases import child, output_of, read_only_prefix

from systems.kernel_runtime.native_build import NativeBuildError, load_extension

_TINY = r"""
#include <Python.h>
#define SYSTEMS_CAT(a, b) a##b
#define SYSTEMS_INIT(name) SYSTEMS_CAT(PyInit_, name)
static PyModuleDef definition = {PyModuleDef_HEAD_INIT, "tiny", nullptr, -1, nullptr};
PyMODINIT_FUNC SYSTEMS_INIT(TORCH_EXTENSION_NAME)(void) {
    PyObject* module = PyModule_Create(&definition);
    if (module != nullptr) PyModule_AddIntConstant(module, "answer", 42);
    return module;
}
"""

# Loads tiny from each cache named on the command line, one line per cache.
_LOADER = """
import os, sys
from pathlib import Path
from systems.kernel_runtime.native_build import NativeBuildError, load_extension
for cache in sys.argv[2:]:
    os.environ["SYSTEMS_CACHE_DIR"] = cache
    try:
        print(load_extension("tiny", Path(sys.argv[1])).answer, flush=True)
    except NativeBuildError as error:
        print("NativeBuildError:", str(error).replace(chr(10), " "), flush=True)
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("source") / "tiny.cpp"
    path.write_text(_TINY)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, source) -> Path:
    """A cache in which tiny is built (copy it: tests damage their cache)."""
    cache = tmp_path_factory.mktemp("built")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SYSTEMS_CACHE_DIR", str(cache))
        patch.delenv("CXX", raising=False)
        assert load_extension("tiny", source).answer == 42
    return cache


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SYSTEMS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    return tmp_path / "cache"


def _copy(built: Path, to: Path) -> Path:
    shutil.copytree(built, to)
    return next(to.glob("extensions/tiny-*/tiny*.so"))


def _load_in_child(source: Path, *caches: Path, prefix: tuple[str, ...] = ()) -> list[str]:
    # Without CXX, as `built` was built: a compiler named by CXX is part of the module's
    # cache key, so the child would look for another module than the one copied.
    return output_of("-c", _LOADER, str(source), *map(str, caches), prefix=prefix,
                     unset=("CXX",))


def _compiler_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "cxx"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_builds_once_and_records_what_it_built(cache, source, capfd):
    assert load_extension("tiny", source).answer == 42
    assert "building tiny" in capfd.readouterr().err
    module = next(cache.glob("extensions/tiny-*/tiny*.so"))
    size, digest = module.with_name(module.name + ".sha256").read_text().split()
    assert int(size) == module.stat().st_size and len(digest) == 64
    assert load_extension("tiny", source).answer == 42
    assert "building" not in capfd.readouterr().err


def test_no_compiler_on_the_path(cache, source, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NativeBuildError, match="no C\\+\\+ compiler found"):
        load_extension("tiny", source)


def test_cxx_naming_a_missing_program(cache, source, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(NativeBuildError, match="CXX=.*no-such-compiler.*names no program"):
        load_extension("tiny", source)


def test_a_failing_compiler_is_reported_with_its_status_and_output(cache, source, monkeypatch,
                                                                     tmp_path):
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(NativeBuildError, match="false exited with status 1: \\(it printed nothing"):
        load_extension("tiny", source)
    monkeypatch.setenv("CXX", str(_compiler_script(tmp_path, "echo 'licence expired' >&2; exit 3")))
    with pytest.raises(NativeBuildError, match="exited with status 3: licence expired"):
        load_extension("tiny", source)
    assert not list(cache.glob("extensions/tiny-*/tiny*.so"))


def test_a_compiler_killed_mid_build(cache, source, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(_compiler_script(tmp_path, "kill -9 $$")))
    with pytest.raises(NativeBuildError, match="was killed by signal 9"):
        load_extension("tiny", source)
    folder = next(cache.glob("extensions/tiny-*"))
    assert not [entry for entry in folder.iterdir() if entry.is_dir()]


def test_a_cache_path_that_is_a_file(cache, source, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for root in (blocker, blocker / "below"):
        monkeypatch.setenv("SYSTEMS_CACHE_DIR", str(root))
        with pytest.raises(NativeBuildError, match="cannot write the extension cache.*"
                                                   "set SYSTEMS_CACHE_DIR to a writable folder"):
            load_extension("tiny", source)


def test_a_read_only_cache(source, built, tmp_path):
    """Empty and read-only: a NativeBuildError that says so. Holding an intact module: it
    loads without writing."""
    empty, filled = tmp_path / "empty", tmp_path / "filled"
    empty.mkdir()
    _copy(built, filled)
    lines = _load_in_child(source, empty, filled, prefix=read_only_prefix(tmp_path))
    assert lines[0].startswith("NativeBuildError: cannot write the extension cache"), lines
    assert "set SYSTEMS_CACHE_DIR to a writable folder" in lines[0]
    assert lines[1] == "42", lines


def test_a_damaged_cached_module_is_rebuilt_before_it_is_loaded(source, built, tmp_path):
    damages = {
        "half": lambda data: data[: len(data) // 2],
        "4KiB": lambda data: data[:4096],
        "empty": lambda data: b"",
        "same size, other bytes": lambda data: data[:4096] + bytes(len(data) - 4096),
    }
    caches = []
    for index, damage in enumerate(damages.values()):
        module = _copy(built, tmp_path / f"cache{index}")
        module.write_bytes(damage(module.read_bytes()))
        caches.append(tmp_path / f"cache{index}")
    record_lost = _copy(built, tmp_path / "record-lost")
    record_lost.with_name(record_lost.name + ".sha256").unlink()
    lines = _load_in_child(source, *caches, tmp_path / "record-lost")
    named = dict(zip([*damages, "record lost"], lines, strict=False))
    assert lines == ["42"] * (len(damages) + 1), named


def test_scratch_folders_of_killed_builds_are_removed(source, built, tmp_path, monkeypatch):
    """A build killed mid-compile (the process, not only its compiler) leaves its scratch
    folder; the next build removes it, and so does a load that finds the module built."""
    cxx = _compiler_script(tmp_path, 'if [ -n "$SLOW_BUILD" ]; then sleep 120; fi\n'
                                     f'exec {shutil.which("c++")} "$@"')
    cache = tmp_path / "cache"
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("SYSTEMS_CACHE_DIR", str(cache))
    process = child("-c", _LOADER, str(source), str(cache), env={"SLOW_BUILD": "1"},
                   start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(cache.glob("extensions/tiny-*/build-*")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    assert load_extension("tiny", source).answer == 42
    folder = next(cache.glob("extensions/tiny-*"))
    assert not [entry for entry in folder.iterdir() if entry.is_dir()]

    module = _copy(built, tmp_path / "built-copy")
    (module.parent / "tmpkilled").mkdir()
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("SYSTEMS_CACHE_DIR", str(tmp_path / "built-copy"))
    assert load_extension("tiny", source).answer == 42
    assert not (module.parent / "tmpkilled").exists()
