"""Launching Triton kernels with less host time per call.

`kernel[grid](...)` binds every argument, specialises it and builds a cache key string
before it reaches the compiled kernel: tens of microseconds per launch, which is most of a
small attention call's time. `CachedLauncher` keeps the compiled kernel that Triton
returned under a key made of what Triton specialises on (dtypes, 16-byte alignment of
pointers, integers equal to 1 or divisible by 16, descriptor block shapes, constexprs and
launch options) and launches it directly when the same key comes back.

The first call for a key, calls under `torch.compile` tracing, the interpreter, and runs
with a launch hook installed (profilers) all go through `kernel[grid](...)` as usual.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from systems.triton_runtime import INTERPRETED


def _int_key(value: int) -> tuple[object, ...]:
    # Triton picks i32/i64/u64 by range, and specialises 1 and multiples of 16.
    return ("int", -2**31 <= value < 2**31, value == 1, value % 16 == 0)


def specialization_key(arg: object) -> object:
    """What Triton's specialisation can tell apart in `arg` (a superset is harmless: it
    only splits the cache). Raises TypeError for argument kinds it does not know."""
    if isinstance(arg, torch.Tensor):
        return ("tensor", arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, TensorDescriptor):
        # Block shape and dtype are what Triton types a descriptor by; the divisibility of
        # its base, shape and strides is kept too, in case a version specialises on them.
        return ("descriptor", arg.base.dtype, tuple(arg.block_shape), arg.padding,
                arg.base.data_ptr() % 16 == 0, *(n % 16 == 0 for n in (*arg.shape, *arg.strides)))
    if isinstance(arg, bool) or arg is None:
        return ("value", arg)
    if isinstance(arg, int):
        return _int_key(arg)
    if isinstance(arg, float):
        return ("float",)
    raise TypeError(f"no launch-cache key for a {type(arg).__name__} argument")


def _launch_hooks_installed() -> bool:
    hook = triton.knobs.runtime.launch_enter_hook
    # Recent Triton keeps hooks in a chain object that is never None; older ones, a callable.
    return bool(getattr(hook, "calls", hook))


class CachedLauncher:
    """`launcher(grid, *args, num_warps=..., num_stages=..., **kwargs)` launches `kernel`
    like `kernel[grid](*args, num_warps=..., num_stages=..., **kwargs)`."""

    def __init__(self, kernel: triton.JITFunction) -> None:
        self.kernel = kernel
        self._names = tuple(kernel.arg_names)
        # The interpreter's kernels have no `params`; they never take the cached path.
        self._constexprs = frozenset(
            () if INTERPRETED else (p.name for p in kernel.params if p.is_constexpr))
        self._compiled: dict[tuple[object, ...], object] = {}

    def __call__(self, grid: Sequence[int], *args: object, num_warps: int, num_stages: int,
                 **kwargs: object) -> None:
        if INTERPRETED or torch.compiler.is_compiling() or _launch_hooks_installed():
            self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **kwargs)
            return
        bound = dict(zip(self._names, args, strict=False), **kwargs)
        # The compiled kernel takes every parameter in order, constexprs included.
        ordered = [bound[name] for name in self._names]
        device = driver.active.get_current_device()
        key = (device, num_warps, num_stages, *(
            ("constexpr", value) if name in self._constexprs else specialization_key(value)
            for name, value in zip(self._names, ordered, strict=True)))
        compiled = self._compiled.get(key)
        if compiled is None:
            self._compiled[key] = self.kernel[grid](
                *args, num_warps=num_warps, num_stages=num_stages, **kwargs)
            return
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        # What JITFunction.run ends with, minus launch metadata and hooks (checked above).
        compiled.run(grid_x, grid_y, grid_z, driver.active.get_current_stream(device),
                     compiled.function, compiled.packed_metadata, None, None, None, *ordered)
