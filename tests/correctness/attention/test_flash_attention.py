"""FlashAttention-2 (PyTorch tiles and Triton kernels) against a float64 reference.

Each error is judged against the error PyTorch's plain attention makes in the same dtype on
the same device (as flash-attention's own tests do): ours may be at most twice as far from
float64, plus a few units in the last place of the dtype. On a machine without CUDA the
Triton kernels run in Triton's interpreter (fp32 and fp16; bf16 needs a GPU).
"""

from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from triton.runtime.errors import OutOfResources

from systems.attention import (
    FlashAttentionPytorch,
    FlashAttentionTriton,
    custom_ops,
    reference_attention,
)
from systems.attention.flash_pytorch import flash_backward as tiled_backward
from systems.attention.flash_pytorch import flash_forward as tiled_forward
from systems.attention.flash_triton import (
    FlashConfig,
    TileConfig,
    flash_backward,
    flash_forward,
    launch,
)
from systems.attention.functions import (
    FlashAttentionTritonCompiledBackward,
    recompute_backward,
)
from systems.attention.host_path import replay
from systems.attention.shared.causal import causal_mask

IMPLEMENTATIONS = {"pytorch": FlashAttentionPytorch, "triton": FlashAttentionTriton}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Rounding slack on top of PyTorch's own error: a few ulps at the scale of the outputs.
SLACK_ULPS = 4

# (leading dims, n_queries, n_keys, head dim): one tile, uneven lengths, n_q != n_k both
# ways, head dims that are not powers of two (80 is the 2.7b model's), no leading dims.
SHAPES = [
    ((2,), 64, 64, 16),
    ((2, 3), 100, 100, 32),
    ((1,), 77, 130, 48),
    ((3,), 130, 50, 64),
    ((), 33, 33, 128),
    ((2, 2), 96, 96, 80),
]
# Larger problems for the GPU, where the kernels' default tiles loop many times.
# The last is the 2.7b model's attention at ctx 512: enough programs for d = 80's own tiles.
GPU_SHAPES = [((2, 4), 1024, 1024, 64), ((1,), 2048, 2048, 128), ((3,), 1000, 3000, 80),
              ((4, 32), 512, 512, 80)]


def _shape_id(shape) -> str:
    lead, n_q, n_k, d = shape
    return f"{'x'.join(map(str, lead)) or 'none'}-q{n_q}-k{n_k}-d{d}"


def _skip_unsupported(impl: str, dtype: torch.dtype, device: torch.device) -> None:
    if impl == "triton" and dtype == torch.bfloat16 and device.type != "cuda":
        pytest.skip("the Triton interpreter computes bf16 dots wrongly; bf16 runs on a GPU")


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    is_causal: bool

    @classmethod
    def random(cls, shape, dtype: torch.dtype, device: torch.device, is_causal: bool,
               seed: int = 0) -> Problem:
        lead, n_q, n_k, d = shape
        gen = torch.Generator().manual_seed(seed)
        q, k, v, do = (torch.randn(*lead, n, d, generator=gen).to(device=device, dtype=dtype)
                       for n in (n_q, n_k, n_k, n_q))
        return cls(q, k, v, do, is_causal)

    def run(self, attention, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """o, L and the three gradients of `attention` on inputs cast to `dtype`."""
        dtype = dtype or self.q.dtype
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in (self.q, self.k, self.v))
        o = attention(q, k, v, self.is_causal)
        o.backward(self.do.to(o.dtype))
        return {"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _reference(q, k, v, is_causal):
    return reference_attention(q, k, v, is_causal)


def _logsumexp(q: torch.Tensor, k: torch.Tensor, is_causal: bool) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_mask(*scores.shape[-2:], q.device), -math.inf)
    return scores.logsumexp(dim=-1)


def assert_close_as_pytorch(ours: torch.Tensor, torch_same_dtype: torch.Tensor,
                            exact: torch.Tensor, name: str) -> None:
    assert torch.isfinite(ours).all(), f"{name}: non-finite values"
    exact = exact.double()
    ours_error = (ours.double() - exact).abs().max().item()
    torch_error = (torch_same_dtype.double() - exact).abs().max().item()
    slack = SLACK_ULPS * torch.finfo(ours.dtype).eps * exact.abs().max().item()
    assert ours_error <= 2 * torch_error + slack, (
        f"{name}: max error {ours_error:.3g} vs PyTorch's {torch_error:.3g} in {ours.dtype}"
    )


def check_against_reference(problem: Problem, attention, dtype: torch.dtype) -> None:
    exact = problem.run(_reference, torch.float64)
    same_dtype = problem.run(_reference, dtype)
    ours = problem.run(attention, dtype)
    for name in exact:
        assert ours[name].dtype == dtype and ours[name].shape == exact[name].shape
        assert_close_as_pytorch(ours[name], same_dtype[name], exact[name], name)


@pytest.fixture
def python_launch_path():
    """Every call plans and launches in Python (no replay), so that tests see its plans."""
    replay.set_enabled(False)
    yield
    replay.set_enabled(True)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_matches_float64_reference(impl, shape, dtype_name, is_causal, device, poisoned_outputs):
    dtype = DTYPES[dtype_name]
    _skip_unsupported(impl, dtype, device)
    problem = Problem.random(shape, dtype, device, is_causal)
    check_against_reference(problem, IMPLEMENTATIONS[impl].apply, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=_shape_id)
def test_triton_long_sequences(shape, dtype_name, is_causal, device, poisoned_outputs):
    problem = Problem.random(shape, DTYPES[dtype_name], device, is_causal)
    check_against_reference(problem, FlashAttentionTriton.apply, DTYPES[dtype_name])


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("d", "dtype_name", "offset"),
                         [(20, "fp16", 0), (17, "fp32", 0), (32, "fp32", 1)],
                         ids=["fp16-d20", "fp32-d17", "fp32-misaligned-view"])
def test_triton_rows_tma_cannot_read(d, dtype_name, offset, is_causal, device, poisoned_outputs):
    """Rows that are not 16-byte multiples, or a view starting off a 16-byte boundary, run
    on a zero-padded copy and still give PyTorch's answer."""
    dtype = DTYPES[dtype_name]
    problem = Problem.random(((2,), 70, 90, d), dtype, device, is_causal)
    if offset:
        def shifted(t: torch.Tensor) -> torch.Tensor:
            storage = torch.empty(t.numel() + offset, dtype=dtype, device=device)
            view = storage[offset:].view(t.shape)
            view.copy_(t)
            return view
        problem.q, problem.k, problem.v = (shifted(t) for t in (problem.q, problem.k, problem.v))
        assert problem.q.data_ptr() % 16 != 0
    check_against_reference(problem, FlashAttentionTriton.apply, dtype)


# Layouts of a (B, H, seq, d) tensor with the same values. Read in place: the model's
# (batch, seq, heads, d) projections seen per head, and rows cut from wider rows. Copied
# first: a start that is not 16-byte aligned, a head dim that is not unit-stride, batch
# dims that do not merge into one, an expanded tensor.
def _seq_major(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _wider_rows(t: torch.Tensor) -> torch.Tensor:
    wide = torch.randn(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype, device=t.device)
    return wide[..., :t.shape[-1]].copy_(t)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    return flat[1:].view(t.shape).copy_(t)


def _head_dim_major(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1).contiguous().transpose(-2, -1)


def _unmergeable_batch(t: torch.Tensor) -> torch.Tensor:
    # (B, H, ...) as (2, B/2, H, ...) whose two batch dims are stored in swapped order
    split = t.reshape(2, t.shape[0] // 2, *t.shape[1:])
    return split.transpose(0, 1).contiguous().transpose(0, 1)


LAYOUTS = {"seq_major": _seq_major, "wider_rows": _wider_rows, "misaligned": _misaligned,
           "head_dim_major": _head_dim_major, "unmergeable_batch": _unmergeable_batch}


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("q_layout", "kv_layout", "do_layout"), [
    ("seq_major", "seq_major", "seq_major"),
    ("wider_rows", "misaligned", "head_dim_major"),
    ("unmergeable_batch", "unmergeable_batch", "unmergeable_batch"),
    ("misaligned", "head_dim_major", "wider_rows"),
])
def test_triton_reads_and_writes_any_layout(q_layout, kv_layout, do_layout, is_causal, device,
                                            poisoned_outputs):
    """Every layout gives bit for bit the packed inputs' o and gradients (the same kernels
    and tiles run on the same values), each laid out as `torch.empty_like` lays out its
    input, as the compiled op's fake version promises."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    packed = Problem.random(((4, 3), 40, 56, 32), dtype, device, is_causal, seed=3)
    expected = packed.run(FlashAttentionTriton.apply)
    q, k, v, do = (LAYOUTS[name](t) for name, t in ((q_layout, packed.q), (kv_layout, packed.k),
                                                     (kv_layout, packed.v), (do_layout, packed.do)))
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    o = FlashAttentionTriton.apply(*inputs, is_causal)
    o.backward(do)
    for name, ours, like in (("o", o, q), ("dq", inputs[0].grad, q), ("dk", inputs[1].grad, k),
                             ("dv", inputs[2].grad, v)):
        assert torch.equal(ours.reshape(expected[name].shape), expected[name]), name
        assert ours.stride() == torch.empty_like(like).stride(), name


def test_triton_reads_an_expanded_gradient(device, poisoned_outputs):
    """`o.sum().backward()` hands the backward a gradient whose strides are all 0."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    problem = Problem.random(((2,), 48, 48, 16), dtype, device, True, seed=4)
    problem.do = torch.ones_like(problem.do)
    expected = problem.run(FlashAttentionTriton.apply)
    q, k, v = (t.detach().requires_grad_() for t in (problem.q, problem.k, problem.v))
    FlashAttentionTriton.apply(q, k, v, True).sum().backward()
    for name, grad in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert torch.equal(grad, expected[name]), name


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_saves_only_logsumexp_besides_inputs_and_output(impl, is_causal, device):
    problem = Problem.random(((2, 3), 40, 56, 16), torch.float32, device, is_causal)
    q, k, v = (t.requires_grad_() for t in (problem.q, problem.k, problem.v))
    o = IMPLEMENTATIONS[impl].apply(q, k, v, is_causal)
    saved = o.grad_fn.saved_tensors
    per_query = [t for t in saved if t.shape == q.shape[:-1]]
    assert len(per_query) == 1, [tuple(t.shape) for t in saved]
    assert sum(t.numel() for t in saved) <= 4 * q.numel() + 2 * k.numel()  # nothing N^2
    exact = _logsumexp(*(t.detach().double() for t in (q, k)), is_causal)
    assert torch.allclose(per_query[0].double(), exact, atol=1e-5, rtol=1e-5)


def _tile_configs() -> st.SearchStrategy[FlashConfig]:
    tiles = st.builds(TileConfig, st.sampled_from([16, 32, 64]), st.sampled_from([16, 32, 64]))
    return st.builds(FlashConfig, tiles, tiles, tiles)


@settings(max_examples=12, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    n_q=st.integers(1, 90), n_k=st.integers(1, 90),
    d=st.sampled_from([16, 24, 40, 64, 72, 96, 128]),
    is_causal=st.booleans(), config=_tile_configs(), seed=st.integers(0, 2**16),
)
def test_triton_any_shape_and_tiling(lead, n_q, n_k, d, is_causal, config, seed):
    """Any lengths (multiples of no tile), head dim and tile shape give the fp32 answer."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    problem = Problem.random((lead, n_q, n_k, d), torch.float32, device, is_causal, seed)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do
    try:
        o, lse = flash_forward(q, k, v, is_causal, config)
        grads = flash_backward(q, k, v, o, lse, do, is_causal, config)
    except OutOfResources:
        # Large fp32 tiles at d = 128 need more shared memory than a GPU has: a property of
        # the drawn config (the tuned configs fit), not an answer to check.
        reject()
    exact = problem.run(_reference, torch.float64)
    tol = 2e-5 * math.sqrt(n_k)
    torch.testing.assert_close(o.double(), exact["o"], atol=tol, rtol=0)
    torch.testing.assert_close(lse.double(), _logsumexp(q.double(), k.double(), is_causal),
                               atol=tol, rtol=0)
    for name, grad in zip(("dq", "dk", "dv"), grads, strict=True):
        torch.testing.assert_close(grad.double(), exact[name], atol=tol * 10, rtol=0)


def test_plans_tell_aligned_from_misaligned_inputs_and_keep_no_tensors(device, monkeypatch,
                                                                        python_launch_path):
    """A plan is kept per layout, start alignment included: a view that starts 4 bytes past
    an aligned address (same shape and strides as an aligned tensor) gets its own plan,
    which copies it (TMA needs 16-byte aligned starts; the interpreter has no such rule, so
    only the plans can show it here). Plans hold layouts, not the tensors of the call that
    made them."""
    plans = {}
    monkeypatch.setattr(launch, "_PLANS", plans)
    shape = (2, 3, 70, 40)
    aligned = torch.randn(shape, device=device)
    misaligned = _misaligned(torch.randn(shape, device=device))
    assert aligned.stride() == misaligned.stride() and misaligned.data_ptr() % 16
    outputs = [flash_forward(q, aligned, aligned, True)[0] for q in (aligned, misaligned)]
    torch.testing.assert_close(outputs[1], flash_forward(misaligned.clone(), aligned,
                                                         aligned, True)[0], atol=0, rtol=0)
    copies = [(plan.q.copy_to, plan.k.copy_to) for plan in plans.values()]
    assert len(copies) == 2 and set(copies) == {(None, None), (40, None)}
    alive = weakref.ref(misaligned)
    del misaligned, outputs
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("layout", ["packed", "transposed"])
def test_tuning_entry_points_run_the_backward_kernels_one_at_a_time(layout, device):
    """The tune module times dQ and dK/dV on their own (`launch.backward_dq`,
    `launch.backward_dkdv`): with the default tiles they give flash_backward's gradients."""
    problem = Problem.random(((2, 3), 70, 90, 40), torch.float32, device, is_causal=True)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do
    if layout == "transposed":  # (batch, seq, heads, d) memory seen as (batch, heads, seq, d)
        q, k, v, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do))
    o, lse = flash_forward(q, k, v, True)
    tiles = launch.default_config(40, torch.float32)
    dq, delta = launch.backward_dq(q, k, v, o, lse, do, True, tiles.backward_dq)
    dk, dv = launch.backward_dkdv(q, k, v, do, lse, delta, True, tiles.backward_dkdv)
    expected = flash_backward(q, k, v, o, lse, do, True)
    for got, want in zip((dq, dk, dv), expected, strict=True):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(delta, (o.double() * do.double()).sum(-1).float())


@pytest.mark.parametrize(("head_dim", "tiles"), [
    (16, (16, 0)), (64, (64, 0)), (128, (128, 0)),  # powers of two: one tile
    (80, (64, 16)), (96, (64, 32)), (72, (64, 16)), (40, (32, 16)), (48, (32, 16)),
    (24, (32, 0)), (112, (128, 0)), (100, (128, 0)),  # a split would do the padded work
])
def test_head_dims_between_powers_of_two_split_where_it_saves_columns(head_dim, tiles):
    assert launch.head_dim_tiles(head_dim) == tiles
    main, tail = tiles
    assert main + tail >= head_dim and (tail == 0 or main + tail < 2 * main)


def test_tiles_follow_the_padded_head_dim_unless_measured_on_their_own():
    """d = 80 (measured at the 2.7b model's sizes) has its own half-precision tiles; d = 96,
    whose padded dim is also 128, takes d = 128's; fp32 keeps its own per padded dim."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    own = launch.default_config(80, bf16)
    assert own != launch.default_config(128, bf16)
    assert launch.default_config(80, fp16) == own
    assert launch.default_config(96, bf16) == launch.default_config(128, bf16)
    assert launch.default_config(80, fp32) == launch.default_config(128, fp32)


@settings(max_examples=20, deadline=None)
@given(
    n_q=st.integers(1, 70), n_k=st.integers(1, 70), is_causal=st.booleans(),
    tile_q=st.sampled_from([16, 24, 32]), tile_k=st.sampled_from([16, 24, 32]),
)
def test_pytorch_tiles_are_exact_in_float64(n_q, n_k, is_causal, tile_q, tile_k):
    """In float64 the tiled algorithm agrees with plain attention to rounding."""
    problem = Problem.random(((2,), n_q, n_k, 16), torch.float64, torch.device("cpu"), is_causal)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do
    o, lse = tiled_forward(q, k, v, is_causal, tile_q, tile_k)
    grads = tiled_backward(q, k, v, o, lse, do, is_causal, tile_q, tile_k)
    exact = problem.run(_reference, torch.float64)
    torch.testing.assert_close(o, exact["o"], atol=1e-12, rtol=0)
    torch.testing.assert_close(lse, _logsumexp(q, k, is_causal), atol=1e-12, rtol=0)
    for name, grad in zip(("dq", "dk", "dv"), grads, strict=True):
        torch.testing.assert_close(grad, exact[name], atol=1e-11, rtol=0)


@pytest.mark.parametrize(("n_q", "n_k"), [(5, 5), (3, 7), (7, 3)])
def test_causal_mask_is_the_lower_triangle_and_its_tiles(n_q, n_k):
    """Query i sees keys 0..i, aligned at position 0 when the lengths differ; a tile placed
    at (q_start, k_start) is that block of the whole mask."""
    whole = causal_mask(n_q, n_k)
    assert torch.equal(whole, torch.ones(n_q, n_k, dtype=torch.bool).tril())
    for q_start, k_start in ((0, 1), (1, 0), (1, 1)):
        tile = causal_mask(2, 2, q_start=q_start, k_start=k_start)
        assert torch.equal(tile, whole[q_start:q_start + 2, k_start:k_start + 2])


def test_pytorch_gradcheck():
    inputs = [torch.randn(2, 20, 16, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradcheck(lambda q, k, v: FlashAttentionPytorch.apply(q, k, v, True),
                                    inputs, fast_mode=True)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_recompute_backward_matches_reference(is_causal):
    """The PyTorch backward used by the compiled-backward variant, run eagerly."""
    problem = Problem.random(((2,), 48, 40, 32), torch.float32, torch.device("cpu"), is_causal)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do
    o, lse = tiled_forward(q, k, v, is_causal)
    exact = problem.run(_reference, torch.float64)
    same_dtype = problem.run(_reference, torch.float32)
    grads = recompute_backward(q, k, v, o, lse, do, is_causal)
    for name, grad in zip(("dq", "dk", "dv"), grads, strict=True):
        assert_close_as_pytorch(grad, same_dtype[name], exact[name], name)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_ops_pass_torch_opcheck(is_causal, device):
    """What torch.compile relies on: the ops' schemas, fake kernels (shapes, dtypes,
    strides) and real kernels agree, and no output aliases an input (torch.library.opcheck
    also traces them through AOT autograd)."""
    problem = Problem.random(((2, 3), 70, 90, 40), torch.float32, device, is_causal)
    q, k, v, do = problem.q, problem.k, problem.v, problem.do
    o, lse = custom_ops.flash_attention_forward(q, k, v, is_causal)
    torch.testing.assert_close(o.double(), problem.run(_reference, torch.float64)["o"],
                               atol=1e-4, rtol=0)
    torch.library.opcheck(custom_ops.flash_attention_forward, (q, k, v, is_causal))
    torch.library.opcheck(custom_ops.flash_attention_backward, (q, k, v, o, lse, do, is_causal))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("variant", ["compiled_apply", "compiled_backward"])
def test_under_torch_compile(variant, dtype_name, device):
    """Through the custom ops in one graph (the CPU runs them in Triton's interpreter)."""
    dtype = DTYPES[dtype_name]
    _skip_unsupported("triton", dtype, device)
    shape = ((4,), 512, 512, 64) if device.type == "cuda" else ((2, 3), 70, 90, 40)
    problem = Problem.random(shape, dtype, device, is_causal=True)
    attention = (torch.compile(FlashAttentionTriton.apply) if variant == "compiled_apply"
                 else FlashAttentionTritonCompiledBackward.apply)
    check_against_reference(problem, attention, dtype)


def test_compiled_apply_reads_misaligned_views(device):
    """Views starting 4 bytes past an aligned address, under torch.compile: the ops run on
    real tensors, so the launch code sees each address and copies what it cannot read in
    place, as in eager calls (the two agree exactly: same kernels, same tiles)."""
    torch._dynamo.reset()
    shape = (2, 70, 40)
    q, k, v = (_misaligned(torch.randn(shape, device=device)).requires_grad_()
               for _ in range(3))
    do = torch.randn(shape, device=device)
    assert q.data_ptr() % 16 != 0
    compiled = torch.compile(FlashAttentionTriton.apply, fullgraph=True)
    grads = {}
    for name, attention in (("compiled", compiled), ("eager", FlashAttentionTriton.apply)):
        o = attention(q, k, v, True)
        grads[name] = (o, *torch.autograd.grad(o, (q, k, v), do))
    for ours, eager in zip(grads["compiled"], grads["eager"], strict=True):
        assert torch.equal(ours, eager)
    exact = reference_attention(*(t.detach().double() for t in (q, k, v)), True)
    torch.testing.assert_close(grads["compiled"][0].double(), exact, atol=1e-4, rtol=0)


def test_compiled_apply_serves_new_lengths_and_head_dims(device):
    """One compiled apply over changing shapes: Dynamo retraces with the sequence length
    symbolic, then the head dim, which the kernels need as a constant. 330 and 200 are not
    multiples of any tile, so the symbolic length also decides a constexpr flag (bf16 on a
    GPU; fp32 through the interpreter on the CPU)."""
    torch._dynamo.reset()
    attention = torch.compile(FlashAttentionTriton.apply)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for n, d in ((256, 64), (330, 64), (330, 128), (200, 96)):
        problem = Problem.random(((2,), n, n, d), dtype, device, is_causal=True)
        check_against_reference(problem, attention, dtype)


@pytest.mark.gpu
def test_cached_launches_tell_specialisations_apart(device, poisoned_outputs):
    """Repeat launches skip Triton's argument binding (`KernelLauncher`). Shapes that share
    tiles but differ in what a kernel is specialised on (the softmax scale of d = 60 and
    d = 64, both padded to 64; lengths 256 and 250) must each run their own kernel, also
    the second time round, when every launch comes from the cache."""
    shapes = [((2,), 256, 256, 64), ((2,), 256, 256, 60), ((2,), 250, 250, 64)]
    for _ in range(2):
        for shape in shapes:
            problem = Problem.random(shape, torch.float16, device, is_causal=True)
            check_against_reference(problem, FlashAttentionTriton.apply, torch.float16)


@pytest.mark.parametrize("attention", ["flash_pytorch", "triton"])
def test_model_with_flash_backend_matches_reference(attention, device):
    from systems.model import MODEL_CONFIGS, TransformerLM

    config = MODEL_CONFIGS["tiny"]
    torch.manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (2, 40), device=device)
    results = {}
    for name in ("reference", attention):
        torch.manual_seed(1)
        model = TransformerLM(config, attention=name).to(device)
        logits = model(tokens)
        logits.float().square().mean().backward()
        results[name] = (logits, [p.grad for p in model.parameters()])
    (ref_logits, ref_grads), (logits, grads) = results["reference"], results[attention]
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, atol=1e-4, rtol=1e-4)


def test_model_hands_the_kernels_views_they_use_in_place(device, monkeypatch, python_launch_path):
    """The model's q, k, v (per-head views of its projections), its output gradient and
    the kernels' outputs need no copy: the kernels read and write those layouts."""
    from systems.model import MODEL_CONFIGS, TransformerLM

    plans = {}  # the plans this model's calls make, from an empty cache
    monkeypatch.setattr(launch, "_PLANS", plans)
    config = MODEL_CONFIGS["tiny"]
    model = TransformerLM(config, attention="triton").to(device)
    tokens = torch.randint(0, config.vocab_size, (2, 40), device=device)
    model(tokens).float().square().mean().backward()
    forward, backward = (launch._ForwardPlan, launch._BackwardPlan)
    assert sorted(type(plan).__name__ for plan in plans.values()) == sorted(
        [forward.__name__, backward.__name__])
    readings = [r for plan in plans.values()
                for r in ((plan.q, plan.k, plan.v) if isinstance(plan, forward)
                          else plan.readings)]
    writings = [w for plan in plans.values()
                for w in ((plan.o,) if isinstance(plan, forward)
                          else (plan.dq_out, plan.dk_out, plan.dv_out))]
    assert [r for r in readings if r.copy_to is not None] == []
    assert [w for w in writings if w.buffer_shape is not None] == []
    # (batch, seq, heads, d) memory: rows d_model apart
    assert {r.strides[-1] for r in readings} == {config.d_model}
    out = launch.flash_forward(*(torch.randn(2, 40, 4, 16, device=device).transpose(1, 2)
                                 for _ in range(3)))[0]
    assert out.transpose(1, 2).is_contiguous()  # reshapes back into d_model for free
