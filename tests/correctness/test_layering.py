"""The package's layers only point down, and no two of its folders import each other.

    common      device facts, NVTX ranges, CLI help             (imports no other layer)
    kernels     kernel_runtime (Triton's interpreter or the GPU, builds, the C++ launcher),
                attention (the FlashAttention-2 core, the Gluon wing, the host path)
    training    model (and its train step, recipes, CUDA-graph capture), optim, distributed,
                checkpoint state helpers, shared CLI flags
    runs        saved runs: schema and keys, reading, baselines, drift, the gate
    measuring   bench, profiling, report, accounting, the `systems` command   (top)

Modules of one layer may import each other, but only one way between two folders. A new
top-level module or package must be placed in a layer here before it can land. Nothing in
the package reads the repository's studies or its doc tools, and a study reads the package
through public names only and other studies only through studies/harness.py.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import systems

PACKAGE = Path(systems.__file__).parent
LAYERS = {
    "common": 0,
    "kernel_runtime": 1, "attention": 1,
    "model": 2, "optim": 2, "distributed": 2, "state_dicts": 2, "cli_flags": 2,
    "runs": 3,
    "bench": 4, "profiling": 4, "report": 4, "accounting": 4, "cli": 4, "__main__": 4,
}


def _top_level_name(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_modules(tree: ast.AST) -> set[str]:
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
    return modules


def _imported_top_levels(tree: ast.AST) -> set[str]:
    return {m.split(".")[1] for m in _imported_modules(tree)
            if m.startswith("systems.") and m.count(".") >= 1}


def _folder_of(module: str) -> str | None:
    """The package folder a dotted module lives in, or None when it is no module of ours."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    if path.is_dir():
        return module
    if path.with_suffix(".py").is_file():
        return module.rpartition(".")[0]
    return None


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
                 or p.parent != PACKAGE)


def test_every_top_level_module_has_a_layer() -> None:
    found = {_top_level_name(p) for p in SOURCES}
    assert found <= LAYERS.keys(), f"place these in a layer: {sorted(found - LAYERS.keys())}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    own = _top_level_name(path)
    upward = sorted(name for name in _imported_top_levels(ast.parse(path.read_text()))
                    if LAYERS.get(name, -1) > LAYERS[own])
    assert not upward, f"{path.relative_to(PACKAGE)} (layer {LAYERS[own]}) imports " + ", ".join(
        f"{name} (layer {LAYERS[name]})" for name in upward)


def folder_imports() -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> the modules behind that arrow. A package's
    face (its __init__.py) speaks for the folder above it only through what it hands on,
    so its own imports are counted for the folder it sits in."""
    arrows = defaultdict(list)
    for path in SOURCES:
        own = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
        for module in _imported_modules(ast.parse(path.read_text())):
            if not module.startswith("systems"):
                continue
            folder = _folder_of(module)
            if folder and folder != own and not own.startswith(folder + "."):
                arrows[own, folder].append(str(path.relative_to(PACKAGE)))
    return arrows


def test_no_two_folders_import_each_other() -> None:
    arrows = folder_imports()
    both_ways = sorted(f"{a} <-> {b}: {sorted(set(arrows[a, b]))} / {sorted(set(arrows[b, a]))}"
                       for a, b in arrows if (b, a) in arrows and a < b)
    assert not both_ways, "folders that import each other:\n" + "\n".join(both_ways)


def _strings_in_code(tree: ast.AST) -> list[str]:
    """String constants other than docstrings: what the code could open or import."""
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_package_reads_no_study_and_no_doc_tool(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert not {m for m in _imported_modules(tree) if m.split(".")[0] in ("tools", "studies")}
    # the repository's studies/ (a saved run's .benchmarks/<GPU>/studies/ is the package's own)
    assert not [s for s in _strings_in_code(tree) if re.search(r"(?<![\w/])studies[/.]", s)], (
        f"{path.relative_to(PACKAGE)} names a study's files")


STUDIES = sorted((PACKAGE.parents[1] / "studies").rglob("*.py"))


def private_imports(tree: ast.AST) -> list[str]:
    """Names starting with `_` imported from the package or a study, and studies imported
    other than through the shared harness."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        top = node.module.split(".")[0]
        if top == "studies" and node.module != "studies.harness":
            found.append(node.module)
        if top in ("systems", "studies"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.parent.name + "/" + p.name)
def test_studies_read_public_names_only(path: Path) -> None:
    assert not private_imports(ast.parse(path.read_text()))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.parent.name + "/" + p.name)
def test_studies_import(path: Path) -> None:
    """Every name a study takes from the package still exists (a study runs rarely, on a
    GPU; its imports are checked on every machine)."""
    root = PACKAGE.parents[1]
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        importlib.import_module(module)


def test_the_check_sees_a_private_import() -> None:
    tree = ast.parse("from systems.x import _y, z\nfrom studies.a.study import w")
    assert private_imports(tree) == ["systems.x._y", "studies.a.study"]


def test_the_check_sees_an_upward_import() -> None:
    tree = ast.parse("from systems.bench.metrics import peak_memory_bytes\nimport systems.report")
    assert _imported_top_levels(tree) == {"bench", "report"}


def test_the_check_sees_two_folders_importing_each_other(monkeypatch) -> None:
    arrows = {("systems.a", "systems.b"): ["a/x.py"], ("systems.b", "systems.a"): ["b/y.py"]}
    monkeypatch.setattr(sys.modules[__name__], "folder_imports", lambda: arrows)
    with pytest.raises(AssertionError, match="systems.a <-> systems.b"):
        test_no_two_folders_import_each_other()
