"""The Gluon kernels for Hopper (`FlashAttentionTritonKernels` with them: the warp-specialised
forward and the fused backward) against a float64 reference, as the Triton kernels are
judged (test_flash_attention.py): at most twice PyTorch's own error in bf16, plus a few
ulps. Ordered, the gradients are bit-identical from run to run. Inputs they cannot take
are refused with the reason, before any kernel runs.

The kernels run on an sm_90 GPU only (the refusals are checked anywhere); that they build
for sm_90 is checked on any machine (test_triton_builds.py)."""

from __future__ import annotations

import functools
import re
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_flash_attention import Problem, _logsumexp, _reference, assert_close_as_pytorch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from systems.attention import custom_ops, get_attention, unsupported_reason
from systems.attention.flash_triton import flash_forward
from systems.attention.flash_triton.launch import head_dim_tiles
from systems.attention.functions import FlashAttentionTritonKernels, FlashAttentionTritonUnordered
from systems.attention.gluon import backward as gluon_backward_module
from systems.attention.gluon.backward import (
    CONFIGS,
    FULL_ORDERED_CONFIGS,
    HEAD_DIMS,
    ONE_MATRIX_ORDERED_CONFIGS,
    PREPARE_ROWS,
    SCHEDULES,
    SHORT_ORDERED_CONFIGS,
    GluonConfig,
    descriptor_layouts,
    gluon_backward,
    library_config,
)
from systems.attention.gluon.backward import descriptor_specs as backward_specs
from systems.attention.gluon.backward import unsupported_reason as gluon_unsupported_reason
from systems.attention.gluon.backward import unsupported_setting as gluon_unsupported_setting
from systems.attention.gluon.backward_kernel import CONSUMER_WARPS, finish_kernel, fragment_layout
from systems.attention.gluon.forward import CONFIGS as GLUON_FORWARD_CONFIGS
from systems.attention.gluon.forward import GluonForwardConfig, gluon_forward
from systems.attention.gluon.forward import descriptor_specs as forward_specs
from systems.common import hardware
from systems.model import ModelConfig, TransformerLM

GRADS = ("dq", "dk", "dv")


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def hopper(test):
    """A GPU test that runs on an sm_90 GPU only."""
    return pytest.mark.gpu(pytest.mark.skipif(
        not _on_hopper(), reason="needs an sm_90 GPU (H100, H200)")(test))


def _attention(deterministic: bool):
    return get_attention("triton_gluon_bwd" if deterministic else "triton_gluon_bwd_unordered")


def _check(problem: Problem, deterministic: bool) -> dict[str, torch.Tensor]:
    exact = problem.run(_reference, torch.float64)
    same_dtype = problem.run(_reference, torch.bfloat16)
    ours = problem.run(_attention(deterministic))
    for name in exact:
        assert ours[name].dtype == torch.bfloat16 and ours[name].shape == exact[name].shape
        assert_close_as_pytorch(ours[name], same_dtype[name], exact[name], name)
    return ours


@hopper
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "unordered"])
@pytest.mark.parametrize("shape", [((2, 4), 1024, 1024, 64), ((3,), 640, 640, 128),
                                   ((1,), 128, 128, 64), ((2,), 2048, 2048, 128),
                                   ((2, 3), 1024, 1024, 80), ((3,), 640, 640, 96),
                                   ((2,), 384, 384, 72), ((1,), 256, 256, 100)],
                         ids=lambda s: f"{'x'.join(map(str, s[0]))}-seq{s[1]}-d{s[3]}")
def test_matches_float64_reference(shape, deterministic):
    _check(Problem.random(shape, torch.bfloat16, torch.device("cuda"), True), deterministic)


@hopper
@settings(max_examples=16, deadline=None)
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
       blocks=st.integers(1, 12), d=st.sampled_from([64, 80, 96, 128]),
       deterministic=st.booleans(), seed=st.integers(0, 2**16))
def test_any_number_of_key_blocks_and_matrices(lead, blocks, d, deterministic, seed):
    """Sequences of 1 to 12 key blocks (odd counts leave one writer a tile short) and 1 to
    9 matrices, at each head dim the backward runs natively (80 and 96 as 64 columns and
    a tail), fresh inputs each time."""
    shape = (lead, 128 * blocks, 128 * blocks, d)
    _check(Problem.random(shape, torch.bfloat16, torch.device("cuda"), True, seed),
           deterministic)


# Every forward schedule the study sweeps (studies/attention_gluon_forward/study.py): ring depth,
# the softmax overlapped with P V or not, the warpgroups' ping-pong or not, one program
# per tile or persistent.
FORWARD_CONFIGS = [GluonForwardConfig(block_n=128, num_stages=stages, async_mma=overlap,
                                      pingpong=pingpong, persistent=persistent)
                   for stages in (2, 3) for overlap in (True, False)
                   for pingpong in (True, False) for persistent in (True, False)]


@hopper
@settings(max_examples=24, deadline=None)
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
       blocks=st.integers(1, 12), d=st.sampled_from([64, 128]),
       config=st.sampled_from(FORWARD_CONFIGS), seed=st.integers(0, 2**16))
def test_forward_any_number_of_tiles_in_every_schedule(lead, blocks, d, config, seed):
    """o within twice PyTorch's bf16 error of the float64 answer and L within 1e-4 of it
    (fp32 sums of exact products), both poisoned with NaN first, for 1 to 12 query tiles
    (one tile: the diagonal alone) and 1 to 9 matrices."""
    problem = Problem.random((lead, 128 * blocks, 128 * blocks, d), torch.bfloat16,
                             torch.device("cuda"), True, seed)
    q, k, v = problem.q, problem.k, problem.v
    o, lse = gluon_forward(q, k, v, True, config, poison=True)
    exact = _reference(q.double(), k.double(), v.double(), True)
    assert_close_as_pytorch(o, _reference(q, k, v, True), exact, "o")
    torch.testing.assert_close(lse.double(), _logsumexp(q.double(), k.double(), True),
                               atol=1e-4, rtol=0)


@hopper
@settings(max_examples=16, deadline=None)
@given(matrices=st.integers(1, 7), blocks=st.integers(1, 9), programs=st.integers(1, 11),
       d=st.sampled_from([64, 128]), overlap=st.booleans(), pingpong=st.booleans(),
       seed=st.integers(0, 2**16))
def test_persistent_forward_gives_each_program_several_tiles(matrices, blocks, programs, d,
                                                             overlap, pingpong, seed):
    """A persistent grid of fewer programs than query tiles (rounds of tiles walked back
    and forth, the last one partial, the K/V ring and the ping-pong's turns carried
    from tile to tile) gives the one-program-per-tile launch's O and L bit for bit,
    both poisoned with NaN first."""
    problem = Problem.random(((matrices,), 128 * blocks, 128 * blocks, d), torch.bfloat16,
                             torch.device("cuda"), True, seed)
    q, k, v = problem.q, problem.k, problem.v
    config = GluonForwardConfig(block_n=128, num_stages=3 if d == 64 else 2,
                                async_mma=overlap, pingpong=pingpong)
    o, lse = gluon_forward(q, k, v, True, config, poison=True)
    o_p, lse_p = gluon_forward(q, k, v, True, replace(config, persistent=True),
                               poison=True, programs=programs)
    assert not o.isnan().any() and not lse.isnan().any()
    assert torch.equal(o_p, o) and torch.equal(lse_p, lse)


@pytest.mark.parametrize(("persistent", "programs", "reason"),
                         [(False, 4, "not persistent"), (True, 0, "at least 1")])
def test_programs_cap_only_a_persistent_forward_of_one_or_more(persistent, programs, reason):
    q = torch.randn(1, 128, 128, dtype=torch.bfloat16,
                    device="cuda" if _on_hopper() else "cpu")
    config = GluonForwardConfig(block_n=128, num_stages=2, async_mma=True, pingpong=True,
                                persistent=persistent)
    match = reason if _on_hopper() else "needs a CUDA device|needs an sm_90"
    with pytest.raises(ValueError, match=match):
        gluon_forward(q, q, q, True, config, programs=programs)


@hopper
def test_forward_op_passes_torch_opcheck():
    """The forward op's schema, fake kernel (a contiguous o whatever q's strides) and real
    kernel agree, on per-head views of (batch, seq, heads, d) projections."""
    q, k, v = (torch.randn(2, 256, 3, 128, device="cuda", dtype=torch.bfloat16)
               .transpose(1, 2) for _ in range(3))
    torch.library.opcheck(custom_ops.flash_attention_forward_gluon, (q, k, v, True))


def test_forward_without_a_config_for_the_head_dim_says_so():
    """The library runs the Gluon forward only at head dims with a tuned config; asked
    for another without one, it says so (before any kernel runs)."""
    missing = next(d for d in (64, 128) if d not in GLUON_FORWARD_CONFIGS)
    q = torch.randn(1, 128, missing, dtype=torch.bfloat16,
                    device="cuda" if _on_hopper() else "cpu")
    if not _on_hopper():
        with pytest.raises(ValueError, match="needs a CUDA device|needs an sm_90"):
            gluon_forward(q, q, q, True)
        return
    with pytest.raises(ValueError, match=f"not {missing}: pass one"):
        gluon_forward(q, q, q, True)


def _check_poisoned(problem: Problem, config: GluonConfig) -> tuple[torch.Tensor, ...]:
    """The backward at `config`, every buffer it writes NaN first, against the float64
    reference; returns (dq, dk, dv)."""
    o, lse = flash_forward(problem.q, problem.k, problem.v, True)
    grads = gluon_backward(problem.q, problem.k, problem.v, o, lse, problem.do, True,
                           config=config, poison=True)
    exact = problem.run(_reference, torch.float64)
    same_dtype = problem.run(_reference, torch.bfloat16)
    for name, grad in zip(GRADS, grads, strict=True):
        assert_close_as_pytorch(grad, same_dtype[name], exact[name], name)
    return grads


@hopper
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("key", sorted(CONFIGS), ids=lambda k: f"d{k[0]}-{'ordered' * k[1]}")
def test_every_buffer_is_written(key, schedule):
    """D, the dQ accumulator and the three gradients start as NaN; none survives, in any
    launch order and tile order (6 matrices: alternating walks odd ones down)."""
    problem = Problem.random(((2, 3), 768, 768, key[0]), torch.bfloat16,
                             torch.device("cuda"), True, seed=1)
    _check_poisoned(problem, replace(CONFIGS[key], schedule=schedule))


LONGEST_FIRST_CONFIGS = (
    [pytest.param(d, c, id=f"short-d{d}") for d, c in SHORT_ORDERED_CONFIGS.items()]
    + [pytest.param(d, c, id=f"full-d{d}") for d, c in FULL_ORDERED_CONFIGS.items()])


@hopper
@pytest.mark.parametrize(("head_dim", "config"), LONGEST_FIRST_CONFIGS)
def test_longest_first_ordered_configs_write_every_buffer_the_same_each_run(head_dim, config):
    """The ordered configs that launch the longest programs first (one writer; the full
    one on chains): every buffer poisoned, gradients bit-identical between calls."""
    problem = Problem.random(((2, 3), 1024, 1024, head_dim), torch.bfloat16,
                             torch.device("cuda"), True, seed=3)
    first = _check_poisoned(problem, config)
    again = _check_poisoned(problem, config)
    for name, a, b in zip(GRADS, first, again, strict=True):
        assert torch.equal(a, b), name


@hopper
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize(("head_dim", "block_m"), [(64, 64), (64, 128), (80, 64), (96, 64),
                                                   (128, 64)])
def test_dq_first_order_writes_every_buffer(head_dim, block_m, ordered):
    """FA3's order of a tile's last matmuls (dQ between dV and dK, handed over while dK
    runs), at both tile heights (128 rows seed dP^T with D) and with a head-dim tail:
    every buffer poisoned, against float64, ordered dQ bit-identical between calls."""
    problem = Problem.random(((2, 3), 768, 768, head_dim), torch.bfloat16,
                             torch.device("cuda"), True, seed=7)
    config = replace(CONFIGS[head_dim, ordered], block_m=block_m, async_mma=True,
                     dq_first=True)
    first = _check_poisoned(problem, config)
    if ordered:
        again = _check_poisoned(problem, config)
        for name, a, b in zip(GRADS, first, again, strict=True):
            assert torch.equal(a, b), name


@hopper
@pytest.mark.parametrize(("async_mma", "dq_first"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_64_row_tiles_write_every_buffer_in_every_order(head_dim, ordered, async_mma,
                                                        dq_first):
    """64-row tiles (LSE and D loaded apart, around the softmax) in every order of a tile's
    last matmuls: every buffer poisoned, against float64, ordered dQ bit-identical between
    calls."""
    problem = Problem.random(((2, 3), 768, 768, head_dim), torch.bfloat16,
                             torch.device("cuda"), True, seed=11)
    config = replace(CONFIGS[head_dim, ordered], block_m=64, async_mma=async_mma,
                     dq_first=dq_first)
    first = _check_poisoned(problem, config)
    if ordered:
        for name, a, b in zip(GRADS, first, _check_poisoned(problem, config), strict=True):
            assert torch.equal(a, b), name


def test_dq_first_needs_async_matmuls():
    with pytest.raises(ValueError, match="needs async_mma"):
        replace(CONFIGS[128, True], async_mma=False, dq_first=True)


@pytest.mark.parametrize(("share", "expected"), [(None, 132), ("25", 33), (" 50 ", 66),
                                                 ("0.1", 1), ("not a number", 132)])
def test_resident_sms_are_the_mps_share_of_the_gpus(monkeypatch, share, expected):
    """Under an MPS server's thread share, fewer SMs than the device reports hold programs
    at once: the ordered backward picks its launch order (and refuses longest first) by
    those, so that no wait is left on a program that cannot start."""
    monkeypatch.setattr(gluon_backward_module.hardware, "sm_count", lambda device: 132)
    if share is None:
        monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    else:
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share)
    assert gluon_backward_module.resident_sms(torch.device("cuda", 0)) == expected


def test_library_config_by_key_blocks_per_sm():
    """Ordered, matrices whose key blocks fit in half the SMs, or all of whose key blocks
    fit in the SMs, launch the longest first; so do 16 or more matrices whose key blocks
    fit in the SMs at d = 64, on chains of accumulators; one longer matrix descends on
    chains, and more of them alternate (no length deadlocks either). Unordered takes one
    config."""
    for head_dim in HEAD_DIMS:
        for matrices in (1, 2, 16):
            assert (library_config(head_dim, True, 66, matrices, 132)
                    == SHORT_ORDERED_CONFIGS[head_dim])
        assert SHORT_ORDERED_CONFIGS[head_dim].schedule == "longest_first"
        assert library_config(head_dim, True, 132, 1, 132) == SHORT_ORDERED_CONFIGS[head_dim]
        full = FULL_ORDERED_CONFIGS.get(head_dim, CONFIGS[head_dim, True])
        for matrices in (2, 15):
            assert library_config(head_dim, True, 67, matrices, 132) == CONFIGS[head_dim, True]
        for key_blocks, matrices in ((67, 16), (128, 16), (132, 64)):
            assert library_config(head_dim, True, key_blocks, matrices, 132) == full
        assert library_config(head_dim, True, 133, 16, 132) == CONFIGS[head_dim, True]
        assert library_config(head_dim, True, 133, 1, 132) == ONE_MATRIX_ORDERED_CONFIGS[head_dim]
        assert ONE_MATRIX_ORDERED_CONFIGS[head_dim].schedule == "descending"
        assert ONE_MATRIX_ORDERED_CONFIGS[head_dim].chains > 1
        assert CONFIGS[head_dim, True].schedule == "alternating"
        for key_blocks, matrices in ((1, 1), (67, 2), (200, 1), (200, 16)):
            assert (library_config(head_dim, False, key_blocks, matrices, 132)
                    == CONFIGS[head_dim, False])


@settings(max_examples=300, deadline=None)
@given(head_dim=st.sampled_from(HEAD_DIMS), deterministic=st.booleans(),
       key_blocks=st.integers(1, 1024), matrices=st.integers(1, 64), sms=st.integers(1, 264))
def test_library_config_never_picks_an_order_that_deadlocks(head_dim, deterministic,
                                                            key_blocks, matrices, sms):
    """Whatever the problem and however many SMs hold programs (an MPS share included), the
    library's pick passes the launch-order check, and only an ordered one adds on chains."""
    config = library_config(head_dim, deterministic, key_blocks, matrices, sms)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gluon_backward_module, "resident_sms", lambda device: sms)
        gluon_backward_module._check_launch_order(config, key_blocks,
                                                  torch.device("cuda", 0))
    assert config.ordered == deterministic
    assert config.chains == 1 or config.ordered


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_launch_order_check_refuses_only_waits_on_programs_not_yet_resident(schedule):
    """Ordered, longest first waits on key blocks launched after it: refused where a
    matrix has more key blocks than SMs hold. Every other schedule, and every unordered
    config, passes at any length."""
    config = replace(CONFIGS[128, True], schedule=schedule)
    device = torch.device("cuda", 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gluon_backward_module, "resident_sms", lambda device: 132)
        gluon_backward_module._check_launch_order(config, 132, device)
        gluon_backward_module._check_launch_order(replace(config, ordered=False), 133, device)
        if schedule == "longest_first":
            with pytest.raises(ValueError, match="would deadlock"):
                gluon_backward_module._check_launch_order(config, 133, device)
        else:
            gluon_backward_module._check_launch_order(config, 133, device)


@hopper
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("head_dim", "chains"), [(64, 2), (80, 3), (128, 4)])
def test_chains_of_accumulators_write_every_buffer_the_same_each_run(head_dim, chains,
                                                                     schedule):
    """dQ added on several chains of accumulators (3 leaves them uneven; 5 matrices of 6
    key blocks, 2 x 3 of 5), ordered and in every launch order: every buffer poisoned,
    against float64, the gradients bit-identical between calls."""
    for shape in (((5,), 768, 768, head_dim), ((2, 3), 640, 640, head_dim)):
        problem = Problem.random(shape, torch.bfloat16, torch.device("cuda"), True, seed=11)
        config = replace(CONFIGS[head_dim, True], schedule=schedule, chains=chains)
        first = _check_poisoned(problem, config)
        again = _check_poisoned(problem, config)
        for name, a, b in zip(GRADS, first, again, strict=True):
            assert torch.equal(a, b), name


def _staged(dq: torch.Tensor, block_m: int) -> torch.Tensor:
    """dq laid out as the backward's writers add it: each query tile's share, its first
    columns then its tail, each as the consumers stage it (`fragment_layout`)."""
    rows, head_dim = dq.shape
    tiles = dq.reshape(rows // block_m, block_m, head_dim)
    parts = []
    start = 0
    for cols in (width for width in head_dim_tiles(head_dim) if width):
        layout = fragment_layout(block_m, cols, CONSUMER_WARPS)
        r, c = torch.arange(block_m)[:, None], torch.arange(cols)[None, :]
        offset = torch.zeros(block_m, cols, dtype=torch.long)
        for bit, (row_bit, col_bit) in enumerate(layout.offset_bases):
            offset += (((r & row_bit) if row_bit else (c & col_bit)) != 0).long() << bit
        assert sorted(offset.flatten().tolist()) == list(range(block_m * cols))  # one each
        part = torch.empty(rows // block_m, block_m * cols, dtype=dq.dtype)
        part[:, offset.flatten()] = tiles[:, :, start:start + cols].reshape(len(part), -1)
        parts.append(part)
        start += cols
    return torch.cat(parts, dim=1).reshape(rows, head_dim)


@pytest.mark.parametrize("chains", [1, 2])
@pytest.mark.parametrize(("block_m", "head_dim"), [(128, 64), (64, 64), (64, 80), (64, 96),
                                                   (64, 128)])
def test_finish_reads_each_share_from_where_the_consumers_stage_it(block_m, head_dim, chains):
    rows = 2 * PREPARE_ROWS * (block_m // 64)
    torch.manual_seed(block_m + head_dim + chains)
    shares = torch.randn(chains, rows, head_dim)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # else interpreted
    acc = torch.stack([_staged(share, block_m) for share in shares]).to(device)
    dq = torch.full((rows, head_dim), float("nan"), dtype=torch.bfloat16, device=device)
    finish_kernel[(rows // PREPARE_ROWS,)](acc, dq, 0.125, HEAD_DIM=head_dim, ROWS=PREPARE_ROWS,
                                           CHAINS=chains, BLOCK_M=block_m,
                                           MAIN=head_dim_tiles(head_dim)[0])
    # within one bf16 step: the interpreter's cast truncates where the GPU's rounds
    torch.testing.assert_close(dq.float().cpu(), shares.sum(dim=0) * 0.125, rtol=2**-7, atol=0)


def test_chains_are_at_least_one():
    with pytest.raises(ValueError, match="chains must be at least 1"):
        replace(CONFIGS[64, True], chains=0)


@hopper
@pytest.mark.parametrize(("async_mma", "dq_first"), [(True, True), (True, False),
                                                   (False, False)],
                         ids=["dq_first", "async", "sync"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize("shape", [((1,), 128), ((3,), 256), ((2, 3), 768), ((2,), 1664)],
                         ids=lambda s: f"{'x'.join(map(str, s[0]))}-seq{s[1]}")
def test_query_tiles_of_128_rows(shape, ordered, schedule, async_mma, dq_first):
    """Tiles of 128 query rows at d = 64 (the library's configs there) in every schedule,
    in each order of a tile's last matmuls (FA3's, overlapped with dQ last, synchronous):
    one diagonal tile per key block, dQ handed over by row halves. Every buffer poisoned,
    for 1 to 13 key blocks and 1 to 6 matrices; ordered, the gradients are bit-identical
    between calls."""
    lead, seq = shape
    config = replace(CONFIGS[64, ordered], block_m=128, schedule=schedule,
                     async_mma=async_mma, dq_first=dq_first)
    problem = Problem.random((lead, seq, seq, 64), torch.bfloat16, torch.device("cuda"),
                             True, seed=seq)
    first = _check_poisoned(problem, config)
    if ordered:
        again = _check_poisoned(problem, config)
        for name, a, b in zip(GRADS, first, again, strict=True):
            assert torch.equal(a, b), name


@hopper
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_ordered_gradients_are_bit_identical_between_runs(head_dim):
    """Many key blocks add into each query tile; in a fixed order the sums never move."""
    problem = Problem.random(((4, 2), 4096, 4096, head_dim), torch.bfloat16,
                             torch.device("cuda"), True, seed=2)
    first = problem.run(_attention(deterministic=True))
    for _ in range(3):
        again = problem.run(_attention(deterministic=True))
        for name in GRADS:
            assert torch.equal(first[name], again[name]), name


@hopper
def test_per_head_views_give_what_contiguous_inputs_give():
    """The model's q, k, v: (batch, heads, seq, d) views of (batch, seq, heads, d)
    projections, with a gradient of the same layout."""
    batch, seq, heads, d = 2, 512, 3, 64
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(batch, seq, heads, d, generator=gen).to("cuda", torch.bfloat16)
                   .transpose(1, 2) for _ in range(4))
    attention = _attention(deterministic=True)

    def grads(*inputs: torch.Tensor) -> list[torch.Tensor]:
        leaves = [t.detach().requires_grad_() for t in inputs[:3]]
        attention(*leaves, True).backward(inputs[3])
        return [t.grad for t in leaves]

    strided = grads(q, k, v, do)
    dense = grads(*(t.contiguous() for t in (q, k, v, do)))
    for name, a, b in zip(GRADS, strided, dense, strict=True):
        assert torch.equal(a, b), name


@hopper
def test_double_backward_is_refused():
    problem = Problem.random(((1,), 256, 256, 64), torch.bfloat16, torch.device("cuda"), True)
    q, k, v = (t.detach().requires_grad_() for t in (problem.q, problem.k, problem.v))
    o = _attention(deterministic=True)(q, k, v, True)
    (dq,) = torch.autograd.grad(o, q, problem.do, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        dq.sum().backward()


@pytest.mark.parametrize(("change", "reason"), [
    ({"is_causal": False}, "needs is_causal=True"),
    ({"n_k": 256}, "of one .* shape"),
    ({"d": 160}, "head dim of at most 128"),
    ({"dtype": torch.float32}, None),
])
@pytest.mark.parametrize("unordered", [False, True], ids=["ordered", "unordered"])
def test_inputs_it_cannot_take_are_refused_in_forward(change, reason, unordered):
    """Refused by FlashAttentionTritonKernels' forward with the reason, on any machine (no
    kernel runs), and so by FlashAttentionTritonUnordered; fp32 is refused as not bf16
    where the GPU is an sm_90, and for the device elsewhere."""
    d, n_k = change.get("d", 64), change.get("n_k", 128)
    dtype = change.get("dtype", torch.bfloat16)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(2, 128, d, dtype=dtype, device=device)
    k, v = (torch.randn(2, n_k, d, dtype=dtype, device=device) for _ in range(2))
    expected = gluon_unsupported_reason(q, k, v, change.get("is_causal", True))
    assert expected is not None and (reason is None or re.search(reason, expected)), expected
    is_causal = change.get("is_causal", True)
    with pytest.raises(ValueError, match=f"gluon_{'un' * unordered}ordered backward needs"):
        if unordered:
            FlashAttentionTritonUnordered.apply(q, k, v, is_causal)
        else:
            FlashAttentionTritonKernels.apply(q, k, v, is_causal, "triton", "gluon_ordered")


def test_registry_says_where_it_cannot_run():
    cpu = unsupported_reason("triton_gluon_bwd", torch.device("cpu"), torch.bfloat16, 1024)
    assert cpu is not None and "CUDA" in cpu
    if _on_hopper():
        cuda = torch.device("cuda")
        assert unsupported_reason("triton_gluon_bwd", cuda, torch.bfloat16, 1024) is None
        assert "multiple of 128" in unsupported_reason("triton_gluon_bwd_unordered", cuda,
                                                       torch.bfloat16, 1000)
        assert "bf16" in unsupported_reason("triton_gluon_bwd", cuda, torch.float16, 1024)


@hopper
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "unordered"])
def test_op_passes_torch_opcheck(deterministic):
    """What torch.compile relies on: the backward op's schema, fake kernel (shapes, dtypes,
    strides) and real kernel agree, and no output aliases an input."""
    problem = Problem.random(((2, 3), 256, 256, 64), torch.bfloat16, torch.device("cuda"),
                             True)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do
    o, lse = flash_forward(q, k, v, True)
    torch.library.opcheck(custom_ops.flash_attention_backward_gluon,
                          (q, k, v, o, lse, do, True, deterministic))


@hopper
def test_compiled_gives_what_eager_gives():
    """Under torch.compile the forward and the Gluon backward run as custom ops in the
    graph: the same kernels, so the ordered gradients equal eager ones bit for bit."""
    torch._dynamo.reset()
    problem = Problem.random(((2, 2), 512, 512, 128), torch.bfloat16, torch.device("cuda"),
                             True, seed=4)

    def attention(q, k, v, is_causal):
        return FlashAttentionTritonKernels.apply(q, k, v, is_causal, "gluon", "gluon_ordered")

    eager = problem.run(attention)
    compiled = problem.run(torch.compile(attention))
    for name in eager:
        assert torch.equal(compiled[name], eager[name]), name


@hopper
def test_model_with_it_compiles_to_one_graph_and_trains_as_with_ours():
    """The model's backend name: its attention reads per-head views; compiled, the model is
    one graph; its gradients are those of the two-pass backward up to bf16 rounding."""
    config = ModelConfig(d_model=128, d_ff=384, num_layers=2, num_heads=2, vocab_size=512,
                         max_seq_len=256)  # head dim 64
    torch.manual_seed(5)
    tokens = torch.randint(0, config.vocab_size, (2, 256), device="cuda")
    grads = {}
    for attention in ("triton_gluon_bwd", "triton"):
        torch.manual_seed(6)
        model = TransformerLM(config, attention=attention).to("cuda", torch.bfloat16)
        model(tokens, tokens).backward()
        grads[attention] = [p.grad.float() for p in model.parameters()]
    for ours, two_pass in zip(grads["triton_gluon_bwd"], grads["triton"], strict=True):
        torch.testing.assert_close(ours, two_pass, atol=2e-2, rtol=2e-2)
    torch._dynamo.reset()
    model = TransformerLM(config, attention="triton_gluon_bwd").to("cuda", torch.bfloat16)
    explanation = torch._dynamo.explain(model)(tokens, tokens)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@hopper
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_more_key_blocks_than_sms(head_dim):
    """Matrices of more key blocks than the GPU has SMs: ordered, the library's schedule
    (one matrix descending on chains, two alternating) has every program wait only on
    programs launched before it, so every wait for a turn ends, and the call replayed from
    C++ gives the same gradients; the longest first would leave the waiting programs
    holding every SM, and is refused. One problem at a time: the float64 reference of
    two takes about 30 GiB."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seq = 128 * (sms + 4)
    for matrices in (1, 2):
        problem = Problem.random(((matrices,), seq, seq, head_dim), torch.bfloat16,
                                 torch.device("cuda"), True, seed=7)
        ours = _check(problem, deterministic=True)
        assert torch.equal(ours["dq"], problem.run(_attention(deterministic=True))["dq"])
        o, lse = flash_forward(problem.q, problem.k, problem.v, True)
        longest_first = replace(CONFIGS[head_dim, True], schedule="longest_first")
        with pytest.raises(ValueError, match="would deadlock"):
            gluon_backward(problem.q, problem.k, problem.v, o, lse, problem.do, True,
                           config=longest_first)
        del problem, ours, o, lse
        torch.cuda.empty_cache()


@pytest.mark.parametrize("specs", [
    *(backward_specs(config, head_dim) for (head_dim, _), config in CONFIGS.items()),
    *(forward_specs(config, head_dim) for head_dim, config in GLUON_FORWARD_CONFIGS.items())])
def test_launch_layouts_are_those_of_descriptors_over_contiguous_rows(specs):
    """The launches keep one descriptor layout per problem (`descriptor_layouts`): it is the
    one Gluon's TensorDescriptor.from_tensor gives for the contiguous rows a call passes,
    at each parameter's index."""
    rows, head_dim = 3 * 256, max(spec[1][-1] for spec in specs.values())
    shapes = {name: (rows,) if len(block) == 1 else (rows, head_dim)
              for name, (_, block, _) in specs.items()}
    layouts = descriptor_layouts(specs, shapes)
    assert sorted(layouts) == list(range(len(specs)))
    for index, (name, (dtype, block, layout)) in enumerate(specs.items()):
        tensor = torch.zeros(shapes[name], dtype=torch.bfloat16 if dtype == "bf16"
                             else torch.float32)
        described = TensorDescriptor.from_tensor(tensor, block, layout)
        assert layouts[index] == (list(described.shape), list(described.strides),
                                  described.block_shape, described.layout)


def test_the_device_check_compiles_without_a_graph_break(monkeypatch):
    """torch.compile traces the Gluon input checks (FlashAttentionTritonKernels' forward):
    the capability read must be a constant to it, not a call it refuses to trace."""
    # The GPU's own limits are read once and cached, as on a GPU.
    monkeypatch.setattr(hardware, "_cuda_target",
                        functools.cache(lambda index: hardware.TARGETS["sm_90"]))

    def checked(x: torch.Tensor) -> torch.Tensor:
        reason = gluon_unsupported_setting(torch.device("cuda", 0), torch.bfloat16, 256)
        return x + 1 if reason is None else x - 1

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(checked)(torch.zeros(4))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert torch.equal(torch.compile(checked)(torch.zeros(4)), torch.ones(4))
