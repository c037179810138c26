"""The analytic memory and communication models against measurements and their own algebra."""

from __future__ import annotations

import math

import pytest
import torch

from systems import accounting as acc
from systems.model import MODEL_CONFIGS, ModelConfig, TransformerLM, cross_entropy
from systems.model.train_step import autocast_context
from systems.profiling.memory import saved_tensor_bytes

SHAPES = [
    (ModelConfig(d_model=64, d_ff=192, num_layers=2, num_heads=4, vocab_size=512,
                 max_seq_len=256), 4, 64),
    (ModelConfig(d_model=96, d_ff=160, num_layers=3, num_heads=6, vocab_size=300,
                 max_seq_len=256), 3, 40),
]


def _measured_activation_bytes(config: ModelConfig, batch: int, seq: int, precision: str,
                               device: torch.device) -> int:
    torch.manual_seed(0)
    model = TransformerLM(config).to(device)
    inputs, targets = torch.randint(config.vocab_size, (2, batch, seq), device=device)

    def forward() -> torch.Tensor:
        with autocast_context(device, precision):
            return cross_entropy(model(inputs.clone()), targets.clone())

    return saved_tensor_bytes(forward, exclude=model.parameters())


@pytest.mark.parametrize("config, batch, seq", SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_model_matches_saved_tensors_on_cpu(config, batch, seq, precision) -> None:
    # CPU autocast keeps softmax in bf16; CUDA's runs it in fp32 (checked on the GPU below).
    measured = _measured_activation_bytes(config, batch, seq, precision, torch.device("cpu"))
    assert measured == acc.activation_bytes(config, batch, seq, precision,
                                            softmax_in_fp32=False)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_model_matches_saved_tensors_on_gpu(precision) -> None:
    config, batch, seq = SHAPES[0]
    measured = _measured_activation_bytes(config, batch, seq, precision, torch.device("cuda"))
    assert measured == acc.activation_bytes(config, batch, seq, precision, softmax_in_fp32=True)


def test_layer_bytes_scale_with_layers_and_residual_stream_is_fp32() -> None:
    config, batch, seq = SHAPES[0]
    deeper = config.with_overrides(num_layers=config.num_layers + 1)
    layer = acc.layer_activation_bytes(config, batch, seq)
    assert acc.activation_bytes(deeper, batch, seq) - acc.activation_bytes(config, batch, seq) \
        == layer
    big = MODEL_CONFIGS["2.7b"]
    assert acc.residual_stream_bytes(big, 4, 512) == 4 * 512 * 2560 * 4


def test_step_memory_pieces_follow_the_mode() -> None:
    config = MODEL_CONFIGS["small"]
    params = config.num_parameters() * 4
    train = acc.step_memory(config, 4, 512, mode="train_step")
    assert (train.parameters, train.gradients, train.optimizer_state) == (params, params,
                                                                          2 * params)
    assert train.peak == max(train.backward_start, train.optimizer_step) >= 5 * params
    forward = acc.step_memory(config, 4, 512, mode="forward")
    assert forward.peak == params and forward.activations == 0
    assert acc.step_memory(config, 4, 512, mode="forward_backward").optimizer_state == 0


def test_reference_attention_part_flops() -> None:
    config = MODEL_CONFIGS["small"]
    flops = acc.reference_attention_part_flops(config, 4, 512)
    per_matmul = config.num_layers * 4 * config.num_heads * 512 * 512 * 2 * config.head_dim
    assert flops["attention_scores"] == flops["attention_final_matmul"] == per_matmul
    assert flops["attention_softmax"] < flops["attention_scores"] / 10


def test_attention_flops_count_the_matmuls_torch_counts() -> None:
    """A forward's count is what torch's FLOP counter sees in plain attention (QK^T and PV,
    n_q != n_k); the causal mask halves it and the modes scale it by 1, 2.5 and 3.5."""
    from torch.utils.flop_counter import FlopCounterMode

    from systems.attention import reference_attention

    q, k, v = torch.randn(3, 24, 16), torch.randn(3, 40, 16), torch.randn(3, 40, 16)
    with FlopCounterMode(display=False) as counter:
        reference_attention(q, k, v)
    forward = acc.attention_flops(3, 24, 40, 16, is_causal=False)
    assert forward == counter.get_total_flops()
    assert acc.attention_flops(3, 24, 40, 16, is_causal=True) == forward / 2
    for mode, factor in (("backward", 2.5), ("forward_backward", 3.5)):
        assert acc.attention_flops(3, 24, 40, 16, False, mode) == factor * forward
    with pytest.raises(ValueError, match="unknown mode"):
        acc.attention_flops(3, 24, 40, 16, False, "train_step")


def test_best_checkpoint_segment_is_near_sqrt_layers_and_beats_no_checkpointing() -> None:
    layers = 64
    # When a block's activations equal its input's size, the optimum is sqrt(L).
    assert acc.best_checkpoint_segment(1000, 1000, layers) == math.isqrt(layers)
    config = MODEL_CONFIGS["2.7b"]
    layer = acc.layer_activation_bytes(config, 4, 512)
    boundary = acc.residual_stream_bytes(config, 4, 512)
    best = acc.best_checkpoint_segment(layer, boundary, config.num_layers)
    cost = acc.checkpointed_activation_bytes(layer, boundary, config.num_layers, best)
    assert cost < layer * config.num_layers
    assert all(cost <= acc.checkpointed_activation_bytes(layer, boundary, config.num_layers, s)
               for s in range(1, config.num_layers + 1))
    with pytest.raises(ValueError):
        acc.checkpointed_activation_bytes(layer, boundary, config.num_layers, 0)


def test_xxl_ffn_memory_and_fsdp_sizing() -> None:
    model = acc.FFNStack()
    assert model.parameters == 126 * 2 * 16384 * 53248
    assert model.state_bytes() == 16 * model.parameters  # fp32 weights, grads, two moments
    tokens, limit = 1024, 95 * 10**9
    devices = model.min_fsdp_devices(tokens, limit)
    assert model.fsdp_bytes_per_device(tokens, devices) <= limit
    assert model.fsdp_bytes_per_device(tokens, devices - 1) > limit
    # Activations replicated on every device can exceed a device no matter the sharding.
    assert model.min_fsdp_devices(10**6, limit) is None


def test_data_parallel_communication_volumes() -> None:
    size, ranks = 1e9, 4
    ddp = acc.data_parallel_bytes_per_step(size, ranks, "ddp")
    assert ddp == pytest.approx(2 * size * 3 / 4)
    assert acc.data_parallel_bytes_per_step(size, ranks, "zero1") == pytest.approx(ddp)
    assert acc.data_parallel_bytes_per_step(size, ranks, "sharded_optimizer") == \
        pytest.approx(1.5 * ddp)
    assert acc.data_parallel_bytes_per_step(size, 1, "ddp") == 0
    with pytest.raises(ValueError):
        acc.data_parallel_bytes_per_step(size, ranks, "zero3")
