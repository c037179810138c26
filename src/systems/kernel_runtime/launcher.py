"""Launching a Triton kernel with little host time per call.

`kernel[grid](...)` binds every argument, specialises it in Python and builds a cache key
before it reaches the compiled kernel: tens of microseconds per launch, most of a small
attention call's time. A `KernelLauncher` stands for one kernel at one specialisation
(grid, constexprs, launch options, argument dtypes, shapes and alignment all fixed by its
owner): its first call goes through `kernel[grid](...)`, which compiles and returns the
compiled kernel, and every later call hands the arguments straight to that kernel.

The owner guarantees that every call passes arguments Triton would specialise alike: the
same dtypes, the same integers, and pointers that are all 16-byte aligned (see
`systems.attention.flash_triton.launch`, which keys its launchers by exact shapes).
Tensor-descriptor arguments have one layout per launcher (the descriptor's fields after its
base: shape, strides, block shape, and for Gluon's descriptors the shared-memory layout;
given at construction): calls pass their base tensors only.

Later calls skip Triton's Python launch wrapper too where its layout is the one checked
(`_DirectLaunch`): they call Triton's compiled C launcher with the arguments already
flattened, and encode each TMA descriptor once per base address rather than on every call.

Once compiled, a launcher can also describe its launch for replay from C++
(`replay_launch`, read by systems/attention/host_path/replay.cpp): the CUfunction, grid,
block and shared memory, and every kernel parameter the compiled kernel takes, in order, as
a constant or as a tensor of the caller's table (`TensorSlot`).

The interpreter, and runs with a launch hook installed (profilers), always go through
`kernel[grid](...)`.
"""

from __future__ import annotations

import inspect
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import triton
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from systems.kernel_runtime.cuda_context import make_primary_context_current
from systems.kernel_runtime.interpreter import INTERPRETED

# A tensor descriptor's layout: its fields after the base tensor, in order (Triton's
# TensorDescriptor: shape, strides, block shape; Gluon's adds the shared-memory layout).
DescriptorLayout = tuple


@dataclass(frozen=True)
class TensorSlot:
    """In a launch described for replay, the tensor at `index` of the call's table."""

    index: int


# replay.cpp's parameter kinds: (kind, tensor index, value).
POINTER, INT32, INT64, TENSOR_MAP = range(4)
# The kernel parameter types replay passes as integers, by Triton signature type.
_INTEGER_KINDS = {"i32": INT32, "i64": INT64}
# A replayed launch: (CUfunction, grid, threads per block, dynamic shared memory bytes,
# parameters, tensor maps) -- replay.cpp's LaunchDescription.
ReplayLaunch = tuple[int, list[int], int, int, list[tuple[int, int, int]], list[tuple]]


def launch_hooks_installed() -> bool:
    hook = triton.knobs.runtime.launch_enter_hook
    # Recent Triton keeps hooks in a chain object that is never None; older ones, a callable.
    return bool(getattr(hook, "calls", hook))


class KernelLauncher:
    """`launcher(*args)` runs `kernel[grid](*args, **constexprs, num_warps=...,
    num_stages=..., maxnreg=...)`, where each argument at an index of `descriptors` is a
    tensor that the kernel reads through a `descriptor_type` (Triton's TensorDescriptor, or
    Gluon's) of that layout, checked by the descriptor on the first call. The constexprs
    must be the kernel's trailing parameters."""

    def __init__(self, kernel: triton.JITFunction, grid: Sequence[int],
                 constexprs: Mapping[str, object], *, num_warps: int, num_stages: int,
                 device_index: int,
                 descriptors: Mapping[int, DescriptorLayout] | None = None,
                 descriptor_type: type = TensorDescriptor,
                 maxnreg: int | None = None) -> None:
        self.kernel = kernel
        self.descriptors = dict(descriptors or {})
        self.descriptor_type = descriptor_type
        self.grid = tuple(grid)
        self.constexprs = dict(constexprs)
        self.options = {"num_warps": num_warps, "num_stages": num_stages}
        if maxnreg is not None:
            self.options["maxnreg"] = maxnreg
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
        self._direct: _DirectLaunch | None = None

    @property
    def direct(self) -> bool:
        """Whether later calls skip Triton's Python launch wrapper (`_DirectLaunch`)."""
        return self._direct is not None

    def _described(self, args: Sequence[object]) -> list[object]:
        """args with each descriptor's base tensor wrapped in its TensorDescriptor."""
        return [self.descriptor_type(arg, *self.descriptors[index])
                if index in self.descriptors else arg for index, arg in enumerate(args)]

    def __call__(self, *args: object) -> None:
        if not INTERPRETED:  # Triton encodes descriptors through the driver
            make_primary_context_current(self._device_index)
        compiled = self._compiled
        if compiled is None or launch_hooks_installed():
            result = self.kernel[self.grid](*self._described(args), **self.constexprs,
                                            **self.options)
            if not INTERPRETED:
                self._compiled = result
                self._direct = _DirectLaunch.of(result, self._grid_xyz, self.descriptors,
                                                self.descriptor_type)
            return
        stream = driver.active.get_current_stream(self._device_index)
        if self._direct is not None:
            self._direct(stream, args, self._trailing)
            return
        grid_x, grid_y, grid_z = self._grid_xyz
        # What JITFunction.run ends with, minus launch metadata and hooks (checked above).
        compiled.run(grid_x, grid_y, grid_z, stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *self._described(args),
                     *self._trailing)

    def replay_launch(self, args: Sequence[object]) -> ReplayLaunch | None:
        """The launch `launcher(*args)` makes, for replay from C++, where each tensor in
        args is a TensorSlot; None before the kernel is compiled, or when the compiled
        kernel takes something replay does not pass (Triton's own launch path only, scratch
        memory, clusters, parameter types other than pointers, i32, i64, fp32 and
        descriptors)."""
        compiled, direct = self._compiled, self._direct
        if direct is None:
            return None
        run, metadata = compiled.run, compiled.metadata
        if metadata.num_ctas != 1 or run.launch_cooperative_grid or run.launch_pdl:
            return None
        values = [*args, *self._trailing]
        signature = list(compiled.src.signature.values())
        if len(signature) != len(values):
            return None
        params: list[tuple[int, int, int]] = []
        maps: list[tuple] = []
        for index, (value, kind) in enumerate(zip(values, signature, strict=True)):
            if kind == "constexpr":  # constexprs, None, and integers Triton specialised
                continue
            if index in direct.descriptors:
                layout, meta = direct.descriptors[index]
                tensor_map = _tensor_map(value, layout, meta)
                if tensor_map is None:
                    return None
                # Triton's expansion of a descriptor (make_tensordesc_arg): the map, then
                # the descriptor's shape (i32) and strides (i64).
                params.append((TENSOR_MAP, 0, len(maps)))
                maps.append(tensor_map)
                shape, strides = layout[:2]
                params += [(INT32, 0, n) for n in shape] + [(INT64, 0, n) for n in strides]
            elif isinstance(kind, str) and kind.startswith("*") and isinstance(value, TensorSlot):
                params.append((POINTER, value.index, 0))
            elif kind in _INTEGER_KINDS and isinstance(value, int):
                params.append((_INTEGER_KINDS[kind], 0, value))
            elif kind == "fp32" and isinstance(value, float):
                params.append((INT32, 0, _fp32_bits(value)))
            else:
                return None
        return (compiled.function, list(self._grid_xyz), 32 * metadata.num_warps,
                metadata.shared, params, maps)


def _fp32_bits(value: float) -> int:
    """The int32 of value's fp32 bits: replay passes an fp32 parameter as those 4 bytes,
    rounded to nearest as Triton's launcher converts a Python float."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _tensor_map(slot: object, layout: DescriptorLayout, meta: Mapping[str, object]
                ) -> tuple | None:
    """replay.cpp's description of the TMA descriptor Triton's `fill_tma_descriptor`
    encodes for this layout and metadata: (tensor, dtype, dims, byte strides, box,
    swizzle, out-of-bounds fill), innermost dim first."""
    if not isinstance(slot, TensorSlot) or meta["fp4_padded"]:
        return None
    shape, strides = layout[:2]
    size = meta["elem_size"]
    host_dtype = sys.modules["triton.backends.nvidia.driver"].TMA_DTYPE_DEVICE_TO_HOST
    # TensorDescriptor's default padding ("zero"): no out-of-bounds fill request.
    return (slot.index, host_dtype[meta["elem_type"]], list(reversed(shape)),
            [size * stride for stride in reversed(strides[:-1])],
            list(reversed(meta["block_size"])), meta["swizzle"], 0)


# Triton's CUDA launcher layout that `_DirectLaunch` reproduces (Triton 3.6): the C
# launcher parses this prefix, then the kernel's arguments, each host-side TMA descriptor
# expanded by `make_tensordesc_arg(descriptor, metadata)` into (tensor map, shape, strides).
_BASE_ARGS_FORMAT = "iiiKKppOOOOOO"
_DESCRIPTOR_CACHE_SIZE = 16


def _closure(function: Callable) -> dict[str, object]:
    cells = function.__closure__ or ()
    return dict(zip(function.__code__.co_freevars, (c.cell_contents for c in cells),
                    strict=True))


class _DirectLaunch:
    """One compiled kernel's launch through Triton's C launcher, without Triton's Python
    wrapper: the fixed part of the C launcher's arguments is built once, descriptors are
    expanded as the wrapper would, and each descriptor's expansion is kept per base
    address (its layout is fixed by the `KernelLauncher`)."""

    def __init__(self, c_launch: Callable, grid_xyz: tuple[int, int, int],
                 after_stream: tuple[object, ...],
                 descriptors: dict[int, tuple[DescriptorLayout, object]],
                 expand: Callable, descriptor_type: type) -> None:
        self._c_launch = c_launch
        # The C launcher's fixed arguments sit either side of each call's stream.
        self._grid = grid_xyz
        self._after_stream = after_stream
        self.descriptors = descriptors  # argument index: (layout, Triton's metadata)
        self._expand = expand
        self._descriptor_type = descriptor_type
        self._expanded: dict[int, dict[int, list[object]]] = {i: {} for i in descriptors}

    @classmethod
    def of(cls, compiled: object, grid_xyz: tuple[int, int, int],
           layouts: Mapping[int, DescriptorLayout],
           descriptor_type: type) -> _DirectLaunch | None:
        """The direct launch of `compiled`, or None when Triton's launcher does not have
        the layout checked here (another Triton version, a kernel that needs scratch
        memory, or descriptors other than `layouts` says): the caller then keeps Triton's
        own path."""
        module = sys.modules.get("triton.backends.nvidia.driver")
        run = getattr(compiled, "run", None)
        wrapped = getattr(run, "launch", None)
        if (getattr(module, "_BASE_ARGS_FORMAT", None) != _BASE_ARGS_FORMAT
                or wrapped is None or run.global_scratch_size or run.profile_scratch_size):
            return None
        expand = getattr(module, "make_tensordesc_arg", None)
        if expand is None or list(inspect.signature(expand).parameters) != ["arg", "metadata"]:
            return None
        if inspect.isbuiltin(wrapped):  # no descriptor arguments: the wrapper is not used
            c_launch, descriptor_meta = wrapped, {}
        else:
            free = _closure(wrapped)
            if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= free.keys():
                return None
            c_launch = free["launcher"]
            indices, metas = sorted(free["tensordesc_indices"]), free["tensordesc_meta"]
            # Without metadata a descriptor expands to its tensor itself, which a cache
            # keyed by address would keep alive.
            if not metas or any(meta is None for meta in metas):
                return None
            descriptor_meta = dict(zip(indices, metas, strict=True))
        if descriptor_meta.keys() != layouts.keys():
            return None
        # function, cooperative grid, PDL, no scratch buffers, the kernel's metadata, and
        # no launch metadata or hooks (installed hooks take Triton's own path).
        after_stream = (compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                        None, None, compiled.packed_metadata, None, None, None)
        descriptors = {i: (layouts[i], meta) for i, meta in descriptor_meta.items()}
        return cls(c_launch, grid_xyz, after_stream, descriptors, expand, descriptor_type)

    def _expanded_descriptor(self, index: int, base: object) -> list[object]:
        by_address = self._expanded[index]
        address = base.data_ptr()
        expanded = by_address.get(address)
        if expanded is None:
            if len(by_address) >= _DESCRIPTOR_CACHE_SIZE:
                by_address.clear()
            layout, meta = self.descriptors[index]
            expanded = by_address[address] = self._expand(self._descriptor_type(base, *layout),
                                                          meta)
        return expanded

    def __call__(self, stream: int, args: Sequence[object],
                 trailing: Sequence[object]) -> None:
        flat: list[object] = [*self._grid, stream, *self._after_stream]
        descriptors = self.descriptors
        for index, arg in enumerate(args):
            if index in descriptors:
                flat.extend(self._expanded_descriptor(index, arg))
            else:
                flat.append(arg)
        flat.extend(trailing)
        self._c_launch(*flat)
