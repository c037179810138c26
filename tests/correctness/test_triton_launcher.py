"""The launch cache's key must separate every argument Triton compiles differently."""

from __future__ import annotations

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from systems.triton_launcher import specialization_key


def test_pointer_alignment_and_dtype_are_told_apart():
    storage = torch.zeros(64, dtype=torch.float32)
    aligned, shifted = storage[:32], storage[1:33]
    assert storage.data_ptr() % 16 == 0
    assert specialization_key(aligned) != specialization_key(shifted)
    assert specialization_key(aligned) != specialization_key(aligned.half())
    assert specialization_key(aligned) == specialization_key(torch.ones(8))


@pytest.mark.parametrize(("a", "b"), [(1, 2), (16, 17), (32, 48 + 1), (2**31 - 1, 2**31)])
def test_integers_split_where_triton_specialises(a, b):
    assert specialization_key(a) != specialization_key(b)


def test_integers_triton_treats_alike_share_a_key():
    assert specialization_key(32) == specialization_key(4096)
    assert specialization_key(17) == specialization_key(1001)


def test_descriptor_block_shape_and_dtype_are_told_apart():
    t = torch.zeros(2, 128, 64, dtype=torch.float16)
    key = specialization_key(TensorDescriptor.from_tensor(t, [1, 64, 64]))
    assert key != specialization_key(TensorDescriptor.from_tensor(t, [1, 128, 64]))
    assert key != specialization_key(TensorDescriptor.from_tensor(t.float(), [1, 64, 64]))
    assert key == specialization_key(TensorDescriptor.from_tensor(t.clone(), [1, 64, 64]))
    shorter = torch.zeros(2, 120, 64, dtype=torch.float16)
    assert key != specialization_key(TensorDescriptor.from_tensor(shorter, [1, 64, 64]))


def test_unknown_argument_kinds_are_refused():
    with pytest.raises(TypeError, match="no launch-cache key"):
        specialization_key("tf32")
