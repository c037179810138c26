"""Eager attention calls replayed from C++ (replay.cpp), so that a call's host path does
not run Python per launch.

A call whose layout (shapes, strides, dtypes, devices, alignment, mask) was seen before is
served by `run`: C++ looks its Program up, allocates the outputs and launches the kernels.
Otherwise the kernels' host code (flash_triton/launch.py, gluon/forward.py, gluon/backward.py)
plans and launches in Python as before, then `keep`s the plan's Program (`replay_program`:
its allocations, its launches as `KernelLauncher.replay_launch` describes them, and its
outputs): `replayed_or_run` is that sequence. Plans that copy inputs or write through
buffers, and launches replay does not support, stay on the Python path. Programs are kept
apart by the kernels they run (TRITON_FORWARD, ..., GLUON_UNORDERED_BACKWARD).

`attend` serves the attention Functions' eager calls whole (functions.py), for a pair of a
forward and a backward kernel: a layout whose forward Program is kept runs in C++ with a
C++ autograd node, whose backward replays the pair's backward Program and calls
`python_backward` (registered by functions.py) with the pair's backward for what replay
does not serve. A launch hook installed between a forward and its backward does not see
that backward's launches.

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
from typing import NamedTuple, Protocol

import torch

from systems.kernel_runtime.interpreter import INTERPRETED
from systems.kernel_runtime.launcher import ReplayLaunch, launch_hooks_installed
from systems.kernel_runtime.native_build import NativeBuildError, load_extension

# The kernels a Program runs: replay.cpp keys Programs by them. A forward's table is
# (q, k, v, then o, L); a backward's (q, k, v, o, L, do, then what it allocates), and its
# outputs are (dq, dk, dv).
(TRITON_FORWARD, TWO_PASS_BACKWARD, GLUON_FORWARD, GLUON_ORDERED_BACKWARD,
 GLUON_UNORDERED_BACKWARD) = range(5)
# How replay.cpp allocates a tensor (`Allocation.kind`): like a tensor of the table; as its
# row statistics (fp32, its shape without the last dim, packed); like it in fp32 (where
# `elements` > 1, that many packed copies stacked); or as `elements` int32 zeros on its
# device (counters a kernel expects zeroed: never poisoned).
LIKE, ROW_STATISTICS, FLOAT32_LIKE, ZEROS = range(4)


class Allocation(NamedTuple):
    """A tensor a replayed call allocates, after its inputs in the call's table."""

    like: int  # the index of the table's tensor it is laid out like, or on the device of
    kind: int
    elements: int = 0  # ZEROS: how many; FLOAT32_LIKE: copies (0 or 1: one)


# (allocations, launches, output indices); the call's table is its inputs, then its
# allocations.
Program = tuple[list[Allocation], list[ReplayLaunch], list[int]]


class Plan(Protocol):
    """The host code of one kernel or pair of kernels for one problem and layout."""

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    def replay_program(self) -> Program | None: ...


def program(allocations: list[Allocation], launches: list[ReplayLaunch | None],
            outputs: list[int]) -> Program | None:
    """A Program of these launches, or None where replay cannot pass one of them."""
    if None in launches:
        return None
    return allocations, launches, outputs


def forward_program(launch: ReplayLaunch | None) -> Program | None:
    """The Program of a forward that writes o (laid out like q) and L in one launch."""
    return program([Allocation(0, LIKE), Allocation(0, ROW_STATISTICS)], [launch], [3, 4])


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


def run(kernels: int, is_causal: bool, tensors: list[torch.Tensor]
        ) -> list[torch.Tensor] | None:
    """The outputs of the Program of these kernels kept for these tensors, or None (no
    Program yet, or replay off)."""
    module = _module
    if module is None or not _enabled or launch_hooks_installed():
        return None
    return module.replay(kernels, is_causal, tensors)


def replayed_or_run(kernels: int, is_causal: bool, tensors: list[torch.Tensor],
                    plan: Callable[[], Plan], replayable: bool = True
                    ) -> tuple[torch.Tensor, ...]:
    """The outputs of these kernels for `tensors`: replayed where their Program of this
    layout is kept, else `plan()` run in Python, its Program then kept for the next call
    (`plan` is only called here: finding a plan costs host time a replayed call saves).
    Not `replayable` (a plan other than the kernels' own: tiles or configs of the caller's,
    poisoned outputs), always run in Python and never kept."""
    if not replayable:
        return plan()(*tensors)
    if replayed := run(kernels, is_causal, tensors):
        return tuple(replayed)
    planned = plan()
    outputs = planned(*tensors)
    keep(kernels, is_causal, tensors, planned)
    return outputs


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
           forward: int, backward: int) -> torch.Tensor | None:
    """o of an attention call replayed with its autograd in C++, running the `forward`
    kernels and, in its backward, the `backward` ones; or None (no forward Program for
    this layout yet, replay off, or functorch transforms active)."""
    module = _module
    if (module is None or not _enabled or launch_hooks_installed()
            or torch._C._are_functorch_transforms_active()):
        return None
    return module.attend(q, k, v, is_causal, forward, backward)


def set_python_backward(backward: Callable[..., Sequence[torch.Tensor]]) -> None:
    """`backward(q, k, v, o, L, do, is_causal, kernels) -> (dq, dk, dv)`, with the `kernels`
    of the call's backward, serves the C++ node's backwards that replay does not: no
    backward Program for the layout, replay off, or create_graph."""
    global _python_backward
    _python_backward = backward
    if _module is not None:
        _module.set_python_backward(backward)


def keep(kernels: int, is_causal: bool, tensors: Sequence[torch.Tensor], plan: Plan) -> None:
    """Keep `plan`'s Program, running these kernels, for later calls with tensors laid out
    as these ones (after the plan has run once: its kernels are compiled)."""
    if not _enabled or tensors[0].device.type != "cuda":
        return
    kept = plan.replay_program()
    if kept is not None and (module := _load()) is not None:
        module.add_program(kernels, is_causal, list(tensors), *kept)


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
