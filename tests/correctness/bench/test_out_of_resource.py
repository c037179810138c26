"""A kernel that needs more shared memory or registers than this GPU has is a recorded skip
with its reason, as out of memory is: a property of the workload on this device."""

from __future__ import annotations

from triton.runtime.errors import OutOfResources

from systems.bench.metrics import is_out_of_memory, out_of_memory_reason


def test_triton_out_of_resource_is_a_skip_that_names_the_resource():
    error = OutOfResources(163872, 101376, "shared memory")
    assert is_out_of_memory(error)
    reason = out_of_memory_reason(error)
    assert reason.startswith("out of resource on this GPU") and "shared memory" in reason
    assert "163872" in reason


def test_other_errors_are_not_skips():
    assert not is_out_of_memory(RuntimeError("illegal memory access"))
