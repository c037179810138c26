"""`KernelLauncher`: one kernel at one specialisation, launched like `kernel[grid](...)`."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import systems.triton_runtime  # noqa: F401 - sets TRITON_INTERPRET before the kernel exists
from systems.triton_launcher import KernelLauncher, _DirectLaunch


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
                           {0: (((8,), (1,), [8]), "meta")}, expand)
    first, second = torch.zeros(8), torch.zeros(8)
    for src in (first, second, first):
        direct(7, (src, "dst", 8), ("SCALE", "BLOCK"))
    assert expansions == [(first.data_ptr(), "meta"), (second.data_ptr(), "meta")]
    assert calls[0] == (4, 2, 1, 7, "function", False, False, None, None, (4, 1, 0), None, None,
                        None, f"map@{first.data_ptr()}", 8, 1, "dst", 8, "SCALE", "BLOCK")
    assert calls[2] == calls[0]
