"""The package's layers only point down: no module imports from a layer above its own.

    common      device facts, NVTX ranges, CLI help             (imports no other layer)
    kernels     attention, the Triton runtime, launcher and ahead-of-time builds, C++ builds
    training    model, optim, distributed, checkpoint state helpers, shared CLI flags
    measuring   bench, profiling, report, accounting, the `systems` command   (top)

Modules of one layer may import each other. A new top-level module or package must be
placed in a layer here before it can land.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import systems

PACKAGE = Path(systems.__file__).parent
LAYERS = {
    "common": 0,
    "attention": 1, "triton_runtime": 1, "triton_launcher": 1, "triton_build": 1,
    "native_build": 1, "cuda_context": 1,
    "model": 2, "optim": 2, "distributed": 2, "state_dicts": 2, "cli_flags": 2,
    "bench": 3, "profiling": 3, "report": 3, "accounting": 3, "cli": 3, "__main__": 3,
}


def _top_level_name(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_top_levels(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        names |= {m.split(".")[1] for m in modules if m.startswith("systems.")}
    return names


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


def test_the_check_sees_an_upward_import() -> None:
    tree = ast.parse("from systems.bench.metrics import peak_memory_bytes\nimport systems.report")
    assert _imported_top_levels(tree) == {"bench", "report"}
