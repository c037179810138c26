"""Making a CUDA device's primary context current in the calling thread.

The CUDA driver API, which Triton calls to encode a TMA descriptor, works on the calling
thread's current context. PyTorch's ops go through the CUDA runtime, which makes a
device's primary context current on a thread's first call that needs one; a thread that
has not made such a call yet (a new Python thread, at times autograd's device thread) has
no current context, and the driver call fails with "invalid device context".
`make_primary_context_current` does first what the runtime would. (replay.cpp does the
same for its own driver calls.)
"""

from __future__ import annotations

import ctypes
import threading

_threads = threading.local()  # per thread: the device indices checked already
_libcuda: ctypes.CDLL | None = None


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed with CUDA driver error {result}")


def make_primary_context_current(device_index: int) -> None:
    """Once per thread and device: where no context is current, make the device's primary
    context (the one PyTorch uses) current."""
    checked = getattr(_threads, "devices", None)
    if checked is None:
        checked = _threads.devices = set()
    if device_index in checked:
        return
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    _check(_libcuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
    if not context.value:
        device = ctypes.c_int()
        _check(_libcuda.cuDeviceGet(ctypes.byref(device), device_index), "cuDeviceGet")
        _check(_libcuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
               "cuDevicePrimaryCtxRetain")
        _check(_libcuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    checked.add(device_index)
