"""The dispatch (`systems.attention.dispatch`): which kernels FlashAttentionTriton runs, that
it only ever picks deterministic ones, and that every pair it can pick is right.

The rules and the plumbing are checked on any machine; the Gluon pairs (and head dims the
Gluon kernels run zero-padded, 80 and 96 among them) against a float64 reference with
every output NaN-poisoned first, on an sm_90 GPU only."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_flash_attention import Problem, _reference, assert_close_as_pytorch

from systems.attention import FlashAttentionTriton, FlashAttentionTritonUnordered, dispatch
from systems.attention.dispatch import (
    DEFAULT,
    DETERMINISTIC_BACKWARDS,
    FORWARDS,
    GLUON,
    GLUON_ORDERED,
    GLUON_UNORDERED,
    HOPPER,
    TABLE,
    TRITON,
    TWO_PASS,
    Kernels,
    Rule,
)
from systems.attention.functions import FlashAttentionTritonKernels
from systems.attention.gluon.backward import cut_to, gluon_head_dim, padded_to
from systems.attention.gluon.forward import forward_head_dim
from systems.attention.registry import get_attention

GRADS = ("dq", "dk", "dv")
BF16 = torch.bfloat16
# Every pair the table may name: the unordered backward is never one.
PICKABLE = [Kernels(f, b) for f, b in itertools.product(FORWARDS, DETERMINISTIC_BACKWARDS)]


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == HOPPER


def hopper(test):
    """A GPU test that runs on an sm_90 GPU only."""
    return pytest.mark.gpu(pytest.mark.skipif(
        not _on_hopper(), reason="needs an sm_90 GPU (H100, H200)")(test))


def test_the_table_names_only_deterministic_kernels_that_can_run_its_rows():
    for rule in TABLE:
        assert rule.kernels.forward in FORWARDS
        assert rule.kernels.backward in DETERMINISTIC_BACKWARDS
        seq = -(-rule.min_seq // 128) * 128
        assert dispatch.runnable(rule.kernels, rule.capability, rule.dtype, rule.head_dim,
                                 seq, True), rule


def _pick(capability=HOPPER, dtype=BF16, head_dim=128, seq=4096, matrices=64,
          table=TABLE) -> Kernels:
    return dispatch._choose(capability, dtype, (2, matrices // 2, seq, head_dim), table)


def test_a_rule_applies_where_it_matches_and_the_kernels_take_the_problem():
    rule = Rule(HOPPER, BF16, 80, min_seq=1024, min_tokens=4 * 1024,
                kernels=Kernels(GLUON, GLUON_ORDERED))
    table = (rule,)
    assert _pick(head_dim=80, seq=1024, matrices=4, table=table) is rule.kernels
    for change in ({"capability": (8, 0)}, {"dtype": torch.float16}, {"head_dim": 64},
                   {"seq": 896, "matrices": 6},  # as many tokens, too short
                   {"matrices": 2},  # too few tokens
                   {"seq": 1100}):  # the Gluon kernels take multiples of 128 only
        problem = {"head_dim": 80, "seq": 1024, "matrices": 4, **change}
        assert _pick(**problem, table=table) is DEFAULT, change


def test_the_first_matching_rule_wins():
    first = Rule(HOPPER, BF16, 128, 1024, 0, Kernels(TRITON, GLUON_ORDERED))
    second = Rule(HOPPER, BF16, 128, 1024, 0, Kernels(GLUON, GLUON_ORDERED))
    assert _pick(table=(first, second)) is first.kernels


def test_calls_off_cuda_or_not_causal_self_attention_run_the_default(device):
    q = torch.randn(2, 256, 64, device=device)
    assert dispatch.choose(q, q, q, True) is DEFAULT  # a CPU or (here) a fp32 problem
    assert dispatch.choose(q, q[:, :128], q[:, :128], True) is DEFAULT
    assert dispatch.choose(q, q, q, False) is DEFAULT


def test_dynamo_traces_the_choice_in_one_graph(monkeypatch):
    """Under torch.compile the dispatch is traced (the capability read once, as a
    constant): a graph break there would split every compiled model at its attention."""
    monkeypatch.setattr(dispatch, "_device_capability", lambda index: HOPPER)

    def kernels_code(x: torch.Tensor) -> torch.Tensor:
        kernels = dispatch._choice(0, BF16, x.shape)
        return x.new_ones(()) * (1 + FORWARDS.index(kernels.forward)
                                 + 2 * DETERMINISTIC_BACKWARDS.index(kernels.backward))

    torch._dynamo.reset()
    compiled = torch.compile(kernels_code, fullgraph=True, backend="eager")
    for shape in ((2, 32, 4096, 128), (2, 32, 4096, 64), (2, 32, 4000, 128)):
        x = torch.ones(1).expand(shape)
        assert compiled(x).item() == kernels_code(x).item(), shape
    assert kernels_code(torch.ones(1).expand(2, 32, 4096, 128)).item() == 4  # Gluon + Gluon


@pytest.mark.parametrize(("head_dim", "forward"), [(64, TRITON), (72, TRITON), (80, TRITON),
                                                   (96, TRITON), (100, GLUON), (128, GLUON)])
def test_named_gluon_variants_take_the_gluon_forward_only_where_it_pads_no_wider(head_dim,
                                                                                 forward):
    """The Gluon forward pads every head dim to 128 (it has no config at 64); the Triton
    forward runs 72 to 96 as 64 columns and a tail, so it serves those."""
    q = torch.empty(2, 128, head_dim)
    assert dispatch.with_gluon_backward(q, GLUON_UNORDERED) == Kernels(forward, GLUON_UNORDERED)


@pytest.mark.parametrize("head_dim", [1, 16, 64, 72, 80, 88, 96, 127, 128, 129])
def test_gluon_head_dims_pad_to_the_kernels_own(head_dim):
    """The backward runs 64, 80, 96 and 128 natively, the forward 64 and 128; each pads
    the others to the next of its own."""
    expected = next((dim for dim in (64, 80, 96, 128) if head_dim <= dim), None)
    assert gluon_head_dim(head_dim) == expected
    assert forward_head_dim(head_dim) == next(
        (dim for dim in (64, 128) if head_dim <= dim), None)
    if expected is None:
        return
    t = torch.randn(3, 5, head_dim)
    padded = padded_to(t, expected)
    assert padded.shape == (3, 5, expected) and padded.is_contiguous()
    assert torch.equal(padded[..., :head_dim], t) and not padded[..., head_dim:].any()
    assert torch.equal(cut_to(padded, head_dim), t) and cut_to(padded, head_dim).is_contiguous()


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_named_kernels_give_what_the_public_function_gives(is_causal, device):
    """The Function the dispatch hands non-default pairs to, with the default pair (the
    only one that runs off an sm_90 GPU): the same outputs and gradients, bit for bit."""
    dtype = torch.float32 if device.type == "cpu" else BF16
    problem = Problem.random(((2,), 70, 70, 32), dtype, device, is_causal, seed=11)
    public = problem.run(FlashAttentionTriton.apply)
    named = problem.run(lambda q, k, v, c: FlashAttentionTritonKernels.apply(
        q, k, v, c, TRITON, TWO_PASS))
    for name in public:
        assert torch.equal(named[name], public[name]), name


def test_the_two_pass_name_runs_the_default_pair_whatever_the_table_names(monkeypatch,
                                                                           device):
    """The registry's `triton_two_pass` (what a dispatch study or a step compares against)
    gives the default pair's outputs and gradients, bit for bit, even where every call
    would be dispatched to the Gluon pair (here refused by the public function off sm_90,
    or run by it there)."""
    dtype = torch.float32 if device.type == "cpu" else BF16
    problem = Problem.random(((2,), 256, 256, 64), dtype, device, True, seed=5)
    default = problem.run(FlashAttentionTriton.apply)
    monkeypatch.setattr(dispatch, "choose", lambda *args: Kernels(GLUON, GLUON_ORDERED))
    two_pass = problem.run(get_attention("triton_two_pass"))
    for name in default:
        assert torch.equal(two_pass[name], default[name]), name
    if not _on_hopper():
        with pytest.raises(ValueError, match="the gluon forward"):
            problem.run(FlashAttentionTriton.apply)


def test_the_unordered_backward_is_refused_off_hopper():
    if _on_hopper():
        pytest.skip("an sm_90 GPU runs it")
    q = torch.randn(1, 128, 64, dtype=BF16, device="cuda" if torch.cuda.is_available()
                    else "cpu")
    with pytest.raises(ValueError, match="gluon_unordered backward needs"):
        FlashAttentionTritonUnordered.apply(q, q, q, True)


def _check(problem: Problem, attention) -> dict[str, torch.Tensor]:
    exact = problem.run(_reference, torch.float64)
    same_dtype = problem.run(_reference, BF16)
    ours = problem.run(attention)
    for name in exact:
        assert ours[name].shape == exact[name].shape
        assert_close_as_pytorch(ours[name], same_dtype[name], exact[name], name)
    return ours


def _named(kernels: Kernels):
    return lambda q, k, v, c: FlashAttentionTritonKernels.apply(q, k, v, c, kernels.forward,
                                                                kernels.backward)


@hopper
@pytest.mark.parametrize("kernels", PICKABLE + [Kernels(GLUON, GLUON_UNORDERED)],
                         ids=lambda k: k.name)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_every_pair_matches_float64(kernels, head_dim, poisoned_outputs,
                                    poisoned_gluon_outputs):
    """Each pair at each head dim the model uses, on (batch, heads) matrices of 640 rows
    (the Gluon forward where it has a config: d 64 has none)."""
    if not dispatch.runnable(kernels, HOPPER, BF16, head_dim, 640, True):
        pytest.skip(f"{kernels.name} does not take d = {head_dim}")
    problem = Problem.random(((2, 3), 640, 640, head_dim), BF16, torch.device("cuda"), True,
                             seed=head_dim)
    ours = _check(problem, _named(kernels))
    if kernels.backward != GLUON_UNORDERED:
        again = problem.run(_named(kernels))
        for name in GRADS:
            assert torch.equal(again[name], ours[name]), name


@hopper
@settings(max_examples=16, deadline=None)
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
       blocks=st.integers(1, 10), head_dim=st.sampled_from([16, 40, 72, 80, 96, 112]),
       kernels=st.sampled_from([Kernels(GLUON, GLUON_ORDERED), Kernels(TRITON, GLUON_ORDERED),
                                Kernels(GLUON, TWO_PASS)]),
       seed=st.integers(0, 2**16))
def test_padded_head_dims_at_any_shape(lead, blocks, head_dim, kernels, seed):
    """Head dims the Gluon kernels run zero-padded, at 1 to 10 key blocks, 1 to 9
    matrices; fresh inputs each time."""
    assume(dispatch.runnable(kernels, HOPPER, BF16, head_dim, 128 * blocks, True))
    problem = Problem.random((lead, 128 * blocks, 128 * blocks, head_dim), BF16,
                             torch.device("cuda"), True, seed)
    _check(problem, _named(kernels))


@hopper
@pytest.mark.parametrize("seq", [640, 700])
def test_the_public_function_runs_what_the_table_names(monkeypatch, seq, poisoned_outputs,
                                                       poisoned_gluon_outputs):
    """A table naming the Gluon pair at a small shape: FlashAttentionTriton runs it there
    (its graph node says so), deterministically, and the default at a length the Gluon
    kernels do not take (700)."""
    rule = Rule(HOPPER, BF16, 80, min_seq=512, min_tokens=0,
                kernels=Kernels(GLUON, GLUON_ORDERED))
    monkeypatch.setattr(dispatch, "TABLE", (rule,))
    problem = Problem.random(((2, 2), seq, seq, 80), BF16, torch.device("cuda"), True,
                             seed=seq)
    ours = _check(problem, FlashAttentionTriton.apply)
    q = problem.q.detach().requires_grad_()
    node = type(FlashAttentionTriton.apply(q, problem.k, problem.v, True).grad_fn).__name__
    assert ("FlashAttentionTritonKernels" in node) == (seq % 128 == 0), node
    again = problem.run(FlashAttentionTriton.apply)
    for name in GRADS:
        assert torch.equal(again[name], ours[name]), name


def test_the_small_gpu_switch_turns_the_gluon_rows_off(monkeypatch):
    """An H100 standing in for an RTX 4090 (SYSTEMS_GPU_LIMITS=sm_89) must run what the
    4090 would: the dispatch and the Gluon kernels see sm_89, so no Gluon pair is picked."""
    from systems.common import hardware

    hopper = hardware.GpuTarget((9, 0), 232448, 65536, 132)
    monkeypatch.setattr(hardware, "_cuda_target", lambda index: hopper)
    dispatch._device_capability.cache_clear()
    assert dispatch._device_capability(0) == HOPPER
    assert _pick(capability=HOPPER, head_dim=128, seq=16384, matrices=64) is not DEFAULT
    monkeypatch.setenv(hardware.GPU_LIMITS_ENV, "sm_89")
    dispatch._device_capability.cache_clear()
    try:
        assert dispatch._device_capability(0) == (8, 9)
        assert _pick(capability=dispatch._device_capability(0), head_dim=128, seq=16384,
                     matrices=64) is DEFAULT
    finally:
        dispatch._device_capability.cache_clear()
