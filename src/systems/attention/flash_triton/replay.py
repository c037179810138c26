"""Eager attention calls replayed from C++ (replay.cpp), so that a call's host path does
not run Python per launch.

A call whose layout (shapes, strides, dtypes, devices, alignment, mask) was seen before is
served by `run`: C++ looks its Program up, allocates the outputs and launches the kernels.
Otherwise launch.py plans and launches in Python as before, then `keep`s the plan's Program
(`replay_program`: its allocations, its launches as `KernelLauncher.replay_launch`
describes them, and its outputs). Plans that copy inputs or write through buffers, and
launches replay does not support, stay on the Python path.

Replay is off under Triton's interpreter, while a launch hook is installed (profilers see
every launch through Triton), with SYSTEMS_ATTENTION_REPLAY=0, and where the extension
cannot be built (one warning, then the Python path).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Protocol

import torch

from systems.native_build import NativeBuildError, load_extension
from systems.triton_launcher import ReplayLaunch, launch_hooks_installed
from systems.triton_runtime import INTERPRETED

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


def _load() -> ModuleType | None:
    global _module, _enabled
    if _module is None and _enabled:
        try:
            _module = load_extension("attention_replay", _SOURCE)
        except NativeBuildError as error:
            _enabled = False
            warnings.warn(f"attention calls stay on the Python launch path: {error}",
                          RuntimeWarning, stacklevel=3)
            return None
        _module.set_poison(_poison)
    return _module


def run(kind: int, is_causal: bool, tensors: list[torch.Tensor]
        ) -> list[torch.Tensor] | None:
    """The outputs of the kept Program for these tensors, or None (no Program yet, or
    replay off)."""
    module = _module
    if module is None or not _enabled or launch_hooks_installed():
        return None
    return module.replay(kind, is_causal, tensors)


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
