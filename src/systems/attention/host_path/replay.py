"""Eager attention calls replayed from C++ (replay.cpp), so that a call's host path does
not run Python per launch.

A call whose layout (shapes, strides, dtypes, devices, alignment, mask) was seen before is
served by `run`: C++ looks its Program up, allocates the outputs and launches the kernels.
Otherwise launch.py plans and launches in Python as before, then `keep`s the plan's Program
(`replay_program`: its allocations, its launches as `KernelLauncher.replay_launch`
describes them, and its outputs). Plans that copy inputs or write through buffers, and
launches replay does not support, stay on the Python path.

`attend` serves FlashAttentionTriton.apply's eager calls whole: a layout whose forward
Program is kept runs in C++ with a C++ autograd node, whose backward replays the backward
Program and calls `python_backward` (registered by function.py) for what replay does not
serve. A launch hook installed between a forward and its backward does not see that
backward's launches.

Replay is off under Triton's interpreter, while a launch hook is installed (profilers see
every launch through Triton), with SYSTEMS_ATTENTION_REPLAY=0, and where the extension
cannot be built (one warning, then the Python path).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Protocol

import torch

from systems.kernel_runtime.interpreter import INTERPRETED
from systems.kernel_runtime.launcher import ReplayLaunch, launch_hooks_installed
from systems.kernel_runtime.native_build import NativeBuildError, load_extension

FORWARD, BACKWARD = 0, 1  # which Program: replay.cpp keys them apart
# How replay.cpp allocates an output: like a tensor of the table, or as its row statistics
# (fp32, its shape without the last dim, packed).
LIKE, ROW_STATISTICS = 0, 1

# (allocations as (tensor index, kind), launches, output indices); the call's table is its
# inputs, then its allocations.
Program = tuple[list[tuple[int, int]], list[ReplayLaunch], list[int]]


class Replayable(Protocol):
    def replay_program(self) -> Program | None: ...


_SOURCE = Path(__file__).with_name("replay.cpp")
_enabled = not INTERPRETED and os.environ.get("SYSTEMS_ATTENTION_REPLAY", "1") != "0"
_module: ModuleType | None = None
_poison = False
_python_backward: Callable[..., Sequence[torch.Tensor]] | None = None


def _load() -> ModuleType | None:
    global _module, _enabled
    if _module is None and _enabled:
        try:
            _module = load_extension("attention_replay", _SOURCE)
        except NativeBuildError as error:
            _enabled = False  # once per process: later calls take the Python path quietly
            warnings.warn(f"eager attention stays on the Python launch path (same results, "
                          f"more host time per call) because its C++ replay is unavailable: "
                          f"{error}\nFix that and restart, or set SYSTEMS_ATTENTION_REPLAY=0 "
                          "to choose the Python path without this warning.",
                          RuntimeWarning, stacklevel=3)
            return None
        _module.set_poison(_poison)
        if _python_backward is not None:
            _module.set_python_backward(_python_backward)
    return _module


def run(kind: int, is_causal: bool, tensors: list[torch.Tensor]
        ) -> list[torch.Tensor] | None:
    """The outputs of the kept Program for these tensors, or None (no Program yet, or
    replay off)."""
    module = _module
    if module is None or not _enabled or launch_hooks_installed():
        return None
    return module.replay(kind, is_causal, tensors)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
           ) -> torch.Tensor | None:
    """o of an attention call replayed with its autograd in C++, or None (no forward
    Program for this layout yet, replay off, or functorch transforms active)."""
    module = _module
    if (module is None or not _enabled or launch_hooks_installed()
            or torch._C._are_functorch_transforms_active()):
        return None
    return module.attend(q, k, v, is_causal)


def set_python_backward(backward: Callable[..., Sequence[torch.Tensor]]) -> None:
    """`backward(q, k, v, o, L, do, is_causal) -> (dq, dk, dv)` serves the C++ node's
    backwards that replay does not: no backward Program for the layout, replay off, or
    create_graph."""
    global _python_backward
    _python_backward = backward
    if _module is not None:
        _module.set_python_backward(backward)


def keep(kind: int, is_causal: bool, tensors: Sequence[torch.Tensor], plan: Replayable) -> None:
    """Keep `plan`'s Program for later calls with tensors laid out as these ones (after
    the plan has run once: its kernels are compiled)."""
    if not _enabled or tensors[0].device.type != "cuda":
        return
    program = plan.replay_program()
    if program is not None and (module := _load()) is not None:
        module.add_program(kind, is_causal, list(tensors), *program)


def set_enabled(enabled: bool) -> None:
    """Turn replay on or off for this process (off: every call takes the Python path; to
    compare the two)."""
    global _enabled
    _enabled = enabled and not INTERPRETED
    if _module is not None:
        _module.set_enabled(_enabled)


def set_poison(poison: bool) -> None:
    """Replayed calls fill their outputs with NaN before the kernels write them (tests:
    an element a kernel forgets to write shows up)."""
    global _poison
    _poison = poison
    if _module is not None:
        _module.set_poison(poison)


def forget() -> None:
    """Drop every kept Program: each layout's next call takes the Python path again."""
    if _module is not None:
        _module.clear()


def replays() -> int:
    """How many calls replay has served in this process."""
    return 0 if _module is None else _module.replays()
