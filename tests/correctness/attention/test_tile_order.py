"""The kernels' tile order in sections of matrices (`shared.tile_order`): the rule's bounds,
and outputs bit for bit those of one section, where the sections split the matrices
unevenly (the Triton kernels in the interpreter without a GPU; bf16 and the Gluon forward
on one)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_flash_attention import DTYPES, Problem, _skip_unsupported
from test_flash_attention_gluon import hopper

from systems.attention.flash_triton import flash_backward, flash_forward
from systems.attention.flash_triton.launch import forget_plans
from systems.attention.gluon.forward import gluon_forward
from systems.attention.host_path import replay
from systems.attention.shared import tile_order
from systems.common import hardware

MiB = 2**20


@given(n_matrices=st.integers(1, 4096), streamed=st.integers(1, 64 * MiB),
       l2=st.integers(1 * MiB, 128 * MiB), sms=st.integers(1, 200))
def test_sections_hold_what_a_share_of_the_l2_holds(n_matrices, streamed, l2, sms):
    group = tile_order.matrices_per_section(n_matrices, streamed, l2, sms)
    assert 1 <= group <= n_matrices
    fits_l2 = n_matrices * streamed <= 2 * l2
    spread = tile_order.SPREAD_TILES * n_matrices <= sms
    if fits_l2 or spread:
        assert group == n_matrices
        return
    assert group == 1 or group * streamed <= tile_order.L2_SHARE * l2
    sections = math.ceil(n_matrices / group)
    # Evened out: one matrix fewer per section would need another section.
    assert group == 1 or math.ceil(n_matrices / (group - 1)) > sections


# (matrices as batch x heads, seq, head dim, matrices per section): 21 matrices in
# sections of 2 (the last holds one) and 25 in sections of 3 (the last holds one).
SPLITS = [((3, 7), 96, 32, 2), ((5, 5), 200, 16, 3)]


def _forget_plans() -> None:
    """Plans made after this work out their tile order again."""
    forget_plans()
    replay.forget()


@pytest.fixture
def sections(monkeypatch):
    """Sets the GPU's L2 and SMs seen by the rule so that `shape` runs in sections of
    `group` matrices; plans made with them are dropped afterwards."""
    def split(lead: tuple[int, ...], seq: int, d: int, itemsize: int, group: int) -> None:
        n_matrices = math.prod(lead)
        streamed = 2 * seq * d * itemsize
        l2 = math.ceil(group * streamed / tile_order.L2_SHARE)
        monkeypatch.setattr(hardware, "l2_bytes", lambda device=None: l2)
        monkeypatch.setattr(hardware, "sm_count", lambda device=None: 1)
        got = tile_order.section_matrices(n_matrices, seq, d, itemsize, torch.device("cpu"))
        assert got == group and n_matrices % group, "the shape must split unevenly"
        _forget_plans()

    yield split
    _forget_plans()


@pytest.mark.parametrize("dtype_name", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(("lead", "seq", "d", "group"), SPLITS)
def test_triton_sections_give_one_sections_outputs(lead, seq, d, group, dtype_name, device,
                                                   sections, poisoned_outputs, monkeypatch):
    dtype = DTYPES[dtype_name]
    _skip_unsupported("triton", dtype, device)
    problem = Problem.random((lead, seq, seq, d), dtype, device, True, seed=seq)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do

    def outputs() -> list[torch.Tensor]:
        o, lse = flash_forward(q, k, v, True)
        return [o, lse, *flash_backward(q, k, v, o, lse, do, True)]

    sections(lead, seq, d, dtype.itemsize, group)
    sectioned = outputs()
    monkeypatch.setattr(tile_order, "SPREAD_TILES", 0)
    _forget_plans()
    whole = outputs()
    for name, a, b in zip(("o", "L", "dq", "dk", "dv"), sectioned, whole, strict=True):
        assert not a.isnan().any(), f"{name}: an element was not written"
        assert torch.equal(a, b), f"{name} differs from one section's"


@hopper
@pytest.mark.parametrize("programs", [None, 5])
def test_gluon_forward_sections_give_one_sections_outputs(programs, sections, monkeypatch):
    """Persistent, every program on its own tiles (None: one per SM, more than the
    tiles) or several each (5)."""
    lead = (3, 7)
    problem = Problem.random((lead, 256, 256, 128), torch.bfloat16, torch.device("cuda"),
                             True, seed=1)
    q, k, v = problem.q, problem.k, problem.v
    sections(lead, 256, 128, 2, 2)
    sectioned = gluon_forward(q, k, v, True, poison=True, programs=programs)
    monkeypatch.setattr(tile_order, "SPREAD_TILES", 0)
    whole = gluon_forward(q, k, v, True, poison=True, programs=programs)
    for name, a, b in zip(("o", "L"), sectioned, whole, strict=True):
        assert not a.isnan().any(), f"{name}: an element was not written"
        assert torch.equal(a, b), f"{name} differs from one section's"
