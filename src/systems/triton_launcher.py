"""Launching a Triton kernel with little host time per call.

`kernel[grid](...)` binds every argument, specialises it in Python and builds a cache key
before it reaches the compiled kernel: tens of microseconds per launch, most of a small
attention call's time. A `KernelLauncher` stands for one kernel at one specialisation
(grid, constexprs, launch options, argument dtypes, shapes and alignment all fixed by its
owner): its first call goes through `kernel[grid](...)`, which compiles and returns the
compiled kernel, and every later call hands the arguments straight to that kernel.

The owner guarantees that every call passes arguments Triton would specialise alike: the
same dtypes, the same integers, descriptors of the same shape, strides and block shape,
and pointers that are all 16-byte aligned (see `systems.attention.flash_triton.launch`,
which keys its launchers by exact shapes).

The interpreter, and runs with a launch hook installed (profilers), always go through
`kernel[grid](...)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import triton
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from systems.triton_runtime import INTERPRETED


class PlannedDescriptor(TensorDescriptor):
    """A TensorDescriptor without the per-call checks: `KernelLauncher` validates it (as a
    plain `TensorDescriptor`) on its first call, and later calls share its layout."""

    def __post_init__(self) -> None:
        pass

    def checked(self) -> TensorDescriptor:
        return TensorDescriptor(self.base, self.shape, self.strides, self.block_shape)


def _checked(arg: object) -> object:
    return arg.checked() if isinstance(arg, PlannedDescriptor) else arg


def _launch_hooks_installed() -> bool:
    hook = triton.knobs.runtime.launch_enter_hook
    # Recent Triton keeps hooks in a chain object that is never None; older ones, a callable.
    return bool(getattr(hook, "calls", hook))


class KernelLauncher:
    """`launcher(*args)` runs `kernel[grid](*args, **constexprs, num_warps=...,
    num_stages=...)`. The constexprs must be the kernel's trailing parameters."""

    def __init__(self, kernel: triton.JITFunction, grid: Sequence[int],
                 constexprs: Mapping[str, object], *, num_warps: int, num_stages: int,
                 device_index: int) -> None:
        self.kernel = kernel
        self.grid = tuple(grid)
        self.constexprs = dict(constexprs)
        self.options = {"num_warps": num_warps, "num_stages": num_stages}
        names = kernel.arg_names
        trailing = names[len(names) - len(self.constexprs):]
        if set(trailing) != set(self.constexprs):
            raise ValueError(f"{kernel.__name__}: constexprs {sorted(self.constexprs)} are "
                             f"not its trailing parameters {trailing}")
        # The compiled kernel takes every parameter in order, constexprs included.
        self._trailing = tuple(self.constexprs[name] for name in trailing)
        self._grid_xyz = (*self.grid, 1, 1)[:3]
        self._device_index = device_index
        self._compiled = None

    def __call__(self, *args: object) -> None:
        compiled = self._compiled
        if compiled is None or _launch_hooks_installed():
            result = self.kernel[self.grid](*map(_checked, args), **self.constexprs,
                                            **self.options)
            if not INTERPRETED:
                self._compiled = result
            return
        grid_x, grid_y, grid_z = self._grid_xyz
        # What JITFunction.run ends with, minus launch metadata and hooks (checked above).
        compiled.run(grid_x, grid_y, grid_z, driver.active.get_current_stream(self._device_index),
                     compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *self._trailing)
