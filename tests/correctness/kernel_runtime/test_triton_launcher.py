"""`KernelLauncher`: one kernel at one specialisation, launched like `kernel[grid](...)`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.backends.nvidia.driver  # noqa: F401 - what replay reads TMA dtypes from
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import systems.kernel_runtime.interpreter  # noqa: F401 - sets TRITON_INTERPRET before the kernel exists
from systems.kernel_runtime.launcher import (
    INT32,
    INT64,
    POINTER,
    TENSOR_MAP,
    KernelLauncher,
    TensorSlot,
    _DirectLaunch,
)


@triton.jit
def _scaled_copy(src_tiles, dst, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    tile = src_tiles.load([start])
    offsets = start + tl.arange(0, BLOCK)
    tl.store(dst + offsets, tile * SCALE, mask=offsets < n)


def _launcher(n: int, block: int, device: torch.device) -> KernelLauncher:
    return KernelLauncher(_scaled_copy, (triton.cdiv(n, block),), {"SCALE": 3.0, "BLOCK": block},
                          num_warps=1, num_stages=1, device_index=device.index or 0,
                          descriptors={0: ((n,), (1,), [block])})


def test_repeat_launches_compute_on_each_call_s_arguments(device):
    """The first call compiles, later ones launch the compiled kernel with new pointers
    (the descriptor's base tensor changes, its layout does not)."""
    n, block = 100, 32
    launch = _launcher(n, block, device)
    for _ in range(3):
        src = torch.randn(n, device=device)
        dst = torch.full((n,), float("nan"), device=device)
        launch(src, dst, n)
        torch.testing.assert_close(dst, 3 * src)


def test_constexprs_must_be_the_trailing_parameters(device):
    with pytest.raises(ValueError, match="trailing parameters"):
        KernelLauncher(_scaled_copy, (1,), {"SCALE": 1.0, "n": 4}, num_warps=1, num_stages=1,
                       device_index=0)


def test_descriptor_layouts_are_checked_on_the_first_call(device):
    """TensorDescriptor's own checks run on the first call (later ones reuse the layout):
    60 fp16 columns make a 120-byte row stride, which TMA cannot use."""
    t = torch.zeros(2, 128, 60, dtype=torch.float16, device=device)
    launch = KernelLauncher(_scaled_copy, (1,), {"SCALE": 1.0, "BLOCK": 64}, num_warps=1,
                            num_stages=1, device_index=0,
                            descriptors={0: ((2, 128, 60), (128 * 60, 60, 1), [1, 64, 64])})
    with pytest.raises(AssertionError, match="16-byte aligned"):
        launch(t, torch.empty(64, device=device), 64)


@pytest.mark.gpu
def test_triton_3_6_launches_skip_the_python_wrapper(device):
    """On the Triton version whose launcher layout `_DirectLaunch` reproduces, repeat
    launches take the direct path (the test above checks their results)."""
    if device.type != "cuda" or not triton.__version__.startswith("3.6"):
        pytest.skip("the direct launch reproduces Triton 3.6's CUDA launcher")
    n, block = 64, 32
    launch = _launcher(n, block, device)
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    launch(src, dst, n)
    assert launch.direct


def test_direct_launch_flattens_arguments_and_expands_a_descriptor_once_per_address():
    calls, expansions = [], []

    def expand(descriptor, metadata):
        expansions.append((descriptor.base.data_ptr(), metadata))
        return [f"map@{descriptor.base.data_ptr()}", *descriptor.shape, *descriptor.strides]

    after_stream = ("function", False, False, None, None, (4, 1, 0), None, None, None)
    direct = _DirectLaunch(lambda *flat: calls.append(flat), (4, 2, 1), after_stream,
                           {0: (((8,), (1,), [8]), "meta")}, expand, TensorDescriptor)
    first, second = torch.zeros(8), torch.zeros(8)
    for src in (first, second, first):
        direct(7, (src, "dst", 8), ("SCALE", "BLOCK"))
    assert expansions == [(first.data_ptr(), "meta"), (second.data_ptr(), "meta")]
    assert calls[0] == (4, 2, 1, 7, "function", False, False, None, None, (4, 1, 0), None, None,
                        None, f"map@{first.data_ptr()}", 8, 1, "dst", 8, "SCALE", "BLOCK")
    assert calls[2] == calls[0]


# A descriptor over (2, 128, 64) bf16 matrices read in (1, 32, 64) tiles, and Triton's
# metadata for it (device dtype 8 is bf16, which the host's TMA API numbers 10).
_LAYOUT = ((2, 128, 64), (8192, 64, 1), [1, 32, 64])
_META = {"swizzle": 3, "elem_size": 2, "elem_type": 8, "block_size": [1, 32, 64],
         "fp4_padded": False}


def _compiled_launcher(signature: dict[str, str], num_ctas: int = 1) -> KernelLauncher:
    """A launcher whose kernel counts as compiled, with what replay reads of Triton's
    compiled kernel: its signature, metadata, function handle and launch flags."""
    launch = KernelLauncher(_scaled_copy, (4,), {"SCALE": 3.0, "BLOCK": 32}, num_warps=4,
                            num_stages=1, device_index=0, descriptors={0: _LAYOUT})
    launch._compiled = SimpleNamespace(
        function=1234, src=SimpleNamespace(signature=signature),
        metadata=SimpleNamespace(num_ctas=num_ctas, num_warps=4, shared=1024),
        run=SimpleNamespace(launch_cooperative_grid=False, launch_pdl=False))
    launch._direct = _DirectLaunch(None, (4, 1, 1), (), {0: (_LAYOUT, _META)}, None,
                                   TensorDescriptor)
    return launch


_SIGNATURE = {"src_tiles": "tensordesc<bf16[1, 32, 64]>", "dst": "*bf16", "n": "i32",
              "SCALE": "constexpr", "BLOCK": "constexpr"}


def test_replay_launch_lists_the_parameters_the_compiled_kernel_takes():
    """Per kernel parameter, in order: a descriptor as its tensor map then its shape (i32)
    and strides (i64), as Triton's launcher expands it; a pointer as its tensor's slot; an
    integer as its value; constexprs not at all. The map is described as
    `fill_tma_descriptor` encodes it: innermost dim first, byte strides without the
    innermost, the metadata's block and swizzle, the host's dtype number."""
    launch = _compiled_launcher(_SIGNATURE)
    function, grid, threads, shared, params, maps = launch.replay_launch(
        (TensorSlot(0), TensorSlot(1), 100))
    assert (function, grid, threads, shared) == (1234, [4, 1, 1], 128, 1024)
    assert params == [(TENSOR_MAP, 0, 0), (INT32, 0, 2), (INT32, 0, 128), (INT32, 0, 64),
                      (INT64, 0, 8192), (INT64, 0, 64), (INT64, 0, 1), (POINTER, 1, 0),
                      (INT32, 0, 100)]
    assert maps == [(0, 10, [64, 128, 2], [128, 16384], [64, 32, 1], 3, 0)]
    # An integer Triton specialised (a 1) is a constexpr of the compiled kernel: not passed.
    specialised = _compiled_launcher({**_SIGNATURE, "n": "constexpr"})
    assert specialised.replay_launch((TensorSlot(0), TensorSlot(1), 1))[4][-1] == (POINTER, 1, 0)


@pytest.mark.parametrize(("value", "bits"), [(0.5, 0x3F000000), (-2.0, -0x40000000),
                                             (0.1, 0x3DCCCCCD)])
def test_replay_launch_passes_an_fp32_parameter_as_its_bits(value, bits):
    """Four bytes either way: the int32 of the float's fp32 bits, rounded to nearest as
    Triton's launcher converts a Python float (0.1 rounds up)."""
    launch = _compiled_launcher({**_SIGNATURE, "n": "fp32"})
    assert launch.replay_launch((TensorSlot(0), TensorSlot(1), value))[4][-1] == (INT32, 0, bits)


@pytest.mark.parametrize("case", ["not compiled", "cluster", "fp64 parameter", "tensor"])
def test_replay_launch_declines_what_replay_cannot_pass(case):
    """Then the caller keeps launching from Python."""
    signature, args = dict(_SIGNATURE), [TensorSlot(0), TensorSlot(1), 100]
    launch = _compiled_launcher(signature, num_ctas=2 if case == "cluster" else 1)
    if case == "not compiled":
        launch._direct = None
    if case == "fp64 parameter":
        signature["n"], args[2] = "fp64", 0.5
    if case == "tensor":  # a real tensor where a slot belongs
        args[1] = torch.zeros(1)
    assert launch.replay_launch(tuple(args)) is None
