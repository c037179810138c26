"""The analytic models behind docs/accounting.md: checkpoint segments, the XXL FFN model
under FSDP, data-parallel communication volumes."""

from __future__ import annotations

import math

import pytest

from systems import accounting as acc
from systems.model import MODEL_CONFIGS
from tools.docgen import doc_accounting as doc


def test_best_checkpoint_segment_is_near_sqrt_layers_and_beats_no_checkpointing() -> None:
    layers = 64
    # When a block's activations equal its input's size, the optimum is sqrt(L).
    assert doc.best_checkpoint_segment(1000, 1000, layers) == math.isqrt(layers)
    config = MODEL_CONFIGS["2.7b"]
    layer = acc.layer_activation_bytes(config, 4, 512)
    boundary = acc.residual_stream_bytes(config, 4, 512)
    best = doc.best_checkpoint_segment(layer, boundary, config.num_layers)
    cost = doc.checkpointed_activation_bytes(layer, boundary, config.num_layers, best)
    assert cost < layer * config.num_layers
    assert all(cost <= doc.checkpointed_activation_bytes(layer, boundary, config.num_layers, s)
               for s in range(1, config.num_layers + 1))
    with pytest.raises(ValueError):
        doc.checkpointed_activation_bytes(layer, boundary, config.num_layers, 0)


def test_xxl_ffn_memory_and_fsdp_sizing() -> None:
    model = doc.FFNStack()
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
    ddp = doc.data_parallel_bytes_per_step(size, ranks, "ddp")
    assert ddp == pytest.approx(2 * size * 3 / 4)
    assert doc.data_parallel_bytes_per_step(size, ranks, "zero1") == pytest.approx(ddp)
    assert doc.data_parallel_bytes_per_step(size, ranks, "sharded_optimizer") == \
        pytest.approx(1.5 * ddp)
    assert doc.data_parallel_bytes_per_step(size, 1, "ddp") == 0
    with pytest.raises(ValueError):
        doc.data_parallel_bytes_per_step(size, ranks, "zero3")


def test_every_table_renders_a_row_per_case() -> None:
    assert len(doc.config_memory_table().splitlines()) == 2 + len(MODEL_CONFIGS) - 1  # no tiny
    assert "| 2.7b | 32 |" in doc.checkpointing_table()
    assert "none fits" in doc.xxl_table()
    assert len(doc.communication_table().splitlines()) == 2 + 2 * 3
