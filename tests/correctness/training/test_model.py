"""The Transformer LM and its layers against torch references and float64 arithmetic."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from systems.attention import reference_attention, sdpa_attention
from systems.model import MODEL_CONFIGS, ModelConfig, TransformerLM, cross_entropy, get_config
from systems.model.layers import RMSNorm, RotaryEmbedding, SwiGLU

TINY = MODEL_CONFIGS["tiny"]


def test_presets_match_design_table() -> None:
    expected = {
        "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16),
        "large": (1280, 5120, 36, 20), "xl": (1600, 6400, 48, 25),
        "2.7b": (2560, 10240, 32, 32),
    }
    for name, dims in expected.items():
        c = MODEL_CONFIGS[name]
        assert (c.d_model, c.d_ff, c.num_layers, c.num_heads) == dims
        assert c.vocab_size == 10_000


def test_num_parameters_counts_every_parameter() -> None:
    model = TransformerLM(TINY)
    assert TINY.num_parameters() == sum(p.numel() for p in model.parameters())
    assert TINY.num_parameters(include_embedding=False) == (
        TINY.num_parameters() - TINY.vocab_size * TINY.d_model
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: get_config("huge"), "unknown model size 'huge'"),
        (lambda: ModelConfig(d_model=100, d_ff=64, num_layers=1, num_heads=3), "not divisible"),
        (lambda: ModelConfig(d_model=64, d_ff=0, num_layers=1, num_heads=4), "d_ff"),
        (lambda: TransformerLM(TINY, attention="magic"), "unknown attention 'magic'"),
    ],
)
def test_bad_configuration_is_a_clear_error(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_context_longer_than_the_model_is_rejected() -> None:
    model = TransformerLM(TINY)
    too_long = torch.randint(TINY.vocab_size, (1, TINY.max_seq_len + 1))
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len"):
        model(too_long)


def test_rmsnorm_matches_torch_in_float64() -> None:
    norm = RMSNorm(48).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 7, 48, dtype=torch.float64)
    expected = F.rms_norm(x, (48,), weight=norm.weight, eps=norm.eps)
    torch.testing.assert_close(norm(x.float()).double(), expected, rtol=1e-6, atol=1e-6)


def test_rmsnorm_keeps_low_precision_dtype() -> None:
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    assert RMSNorm(16)(x).dtype == torch.bfloat16


def test_rope_is_rotation_by_complex_phase() -> None:
    head_dim, seq, theta = 16, 11, 10_000.0
    rope = RotaryEmbedding(head_dim, max_seq_len=32, theta=theta)
    x = torch.randn(2, 3, seq, head_dim)
    positions = torch.arange(seq)
    # Reference: pairs (2i, 2i+1) as complex numbers times exp(i * pos * theta^(-2i/d)).
    x64 = x.double().view(2, 3, seq, head_dim // 2, 2)
    as_complex = torch.complex(x64[..., 0], x64[..., 1])
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    phase = torch.polar(torch.ones(seq, head_dim // 2, dtype=torch.float64),
                        positions.double()[:, None] * freqs)
    rotated = as_complex * phase
    expected = torch.stack((rotated.real, rotated.imag), dim=-1).flatten(-2)
    torch.testing.assert_close(rope(x, positions).double(), expected, rtol=1e-5, atol=1e-5)


def test_rope_preserves_norms_and_relative_positions() -> None:
    rope = RotaryEmbedding(8, max_seq_len=64, theta=10_000.0)
    q, k = torch.randn(8), torch.randn(8)
    dots = []
    for shift in (0, 5, 20):
        pos_q, pos_k = torch.tensor([7 + shift]), torch.tensor([3 + shift])
        rq, rk = rope(q[None], pos_q)[0], rope(k[None], pos_k)[0]
        assert torch.isclose(rq.norm(), q.norm(), rtol=1e-5)
        dots.append(torch.dot(rq, rk))
    torch.testing.assert_close(torch.stack(dots), dots[0].expand(3), rtol=1e-5, atol=1e-5)


def test_swiglu_matches_formula() -> None:
    ffn = SwiGLU(12, 20)
    x = torch.randn(4, 12)
    expected = (F.silu(x @ ffn.w1.weight.T) * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)


@settings(deadline=None, max_examples=25)
@given(
    batch=st.integers(1, 3), heads=st.integers(1, 3), n_queries=st.integers(1, 40),
    extra_keys=st.integers(0, 9), head_dim=st.sampled_from([4, 8, 16, 24]),
    is_causal=st.booleans(),
)
def test_reference_attention_matches_sdpa(batch, heads, n_queries, extra_keys, head_dim,
                                          is_causal) -> None:
    n_keys = n_queries if is_causal else n_queries + extra_keys
    q = torch.randn(batch, heads, n_queries, head_dim, dtype=torch.float64)
    k = torch.randn(batch, heads, n_keys, head_dim, dtype=torch.float64)
    v = torch.randn(batch, heads, n_keys, head_dim, dtype=torch.float64)
    torch.testing.assert_close(reference_attention(q, k, v, is_causal),
                               sdpa_attention(q, k, v, is_causal))


@pytest.mark.parametrize("attention", ["reference", "sdpa"])
def test_output_never_depends_on_future_tokens(attention: str) -> None:
    torch.manual_seed(0)
    model = TransformerLM(TINY, attention=attention).double()
    tokens = torch.randint(TINY.vocab_size, (2, 24))
    t = 10
    changed = tokens.clone()
    changed[:, t + 1:] = torch.randint(TINY.vocab_size, (2, 24 - t - 1))
    assert not torch.equal(tokens, changed)
    logits, logits_changed = model(tokens), model(changed)
    torch.testing.assert_close(logits[:, : t + 1], logits_changed[:, : t + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(logits[:, t + 1:], logits_changed[:, t + 1:])


def test_attention_backends_give_the_same_model() -> None:
    torch.manual_seed(0)
    reference = TransformerLM(TINY, attention="reference").double()
    sdpa = TransformerLM(TINY, attention="sdpa").double()
    sdpa.load_state_dict(reference.state_dict())
    tokens = torch.randint(TINY.vocab_size, (2, 33))
    torch.testing.assert_close(reference(tokens), sdpa(tokens))


def test_model_output_shape_and_gradients_reach_every_parameter() -> None:
    model = TransformerLM(TINY)
    tokens = torch.randint(TINY.vocab_size, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, TINY.vocab_size)
    cross_entropy(logits, torch.randint(TINY.vocab_size, (3, 17))).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


@settings(deadline=None, max_examples=20)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), vocab=st.integers(2, 50),
       scale=st.floats(0.1, 50.0))
def test_cross_entropy_matches_torch(shape, vocab, scale) -> None:
    logits = torch.randn(*shape, vocab, dtype=torch.float64) * scale
    targets = torch.randint(vocab, tuple(shape))
    expected = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets).double(), expected)


def test_cross_entropy_is_stable_for_huge_logits() -> None:
    logits = torch.tensor([[1e4, 0.0, -1e4]], dtype=torch.bfloat16)
    loss = cross_entropy(logits, torch.tensor([1]))
    # log(e^a + 1 + e^-a) - 0 == a up to e^-a; a is 1e4 as rounded to bf16.
    assert loss.dtype == torch.float32
    assert math.isclose(loss.item(), logits[0, 0].item(), rel_tol=1e-6)


def test_cross_entropy_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="do not match"):
        cross_entropy(torch.randn(4, 10), torch.randint(10, (5,)))


@pytest.mark.parametrize("attention", ["sdpa", "triton"])
def test_compiled_model_is_one_graph(attention, device) -> None:
    """torch.compile traces the whole model, attention included (a split graph would run
    attention eagerly between two compiled pieces and copy its inputs' gradients)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter: fp32
    model = TransformerLM(MODEL_CONFIGS["tiny"], attention=attention).to(device, dtype)
    tokens = torch.randint(0, MODEL_CONFIGS["tiny"].vocab_size, (2, 32), device=device)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(tokens, tokens)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
