"""Runs saved before the suites spoke one vocabulary (context_length, context, model,
bucket_mb) read like runs saved since (seq_len, size, bucket_size_mb)."""

from __future__ import annotations

from pathlib import Path

import systems
from systems.runs import keys
from systems.runs.history import load_run

BENCHMARKS = Path(systems.__file__).parents[2] / ".benchmarks"


def test_retired_keys_read_under_their_current_names() -> None:
    old_step = {"size": "xl", "context_length": 512, "mode": "train_step"}
    new_step = {"size": "xl", "seq_len": 512, "mode": "train_step"}
    old_ddp = {"variant": "bucketed", "model": "xl", "context": 128, "bucket_mb": 100}
    new_ddp = {"variant": "bucketed", "size": "xl", "seq_len": 128, "bucket_size_mb": 100}
    for old, new in ((old_step, new_step), (old_ddp, new_ddp)):
        read_old, read_new = keys.normalise(old), keys.normalise(new)
        assert {k: read_old[k] for k in new} == read_new
        assert keys.kind(read_old) == keys.kind(read_new)


def test_retired_attention_names_read_as_the_one_name_now() -> None:
    """Recipe runs saved when the Triton backend had two names read as today's one, as
    the registry knows it."""
    from systems.attention import ATTENTION_BACKENDS

    old = keys.normalise({"recipe": "optimized", "attention": "flash_triton"})
    assert old[keys.ATTENTION] == "triton" and "triton" in ATTENTION_BACKENDS
    assert "flash_triton" not in ATTENTION_BACKENDS
    assert keys.normalise({"attention": "sdpa"})[keys.ATTENTION] == "sdpa"
    one_gpu = load_run(BENCHMARKS / "NVIDIA_H100_80GB_HBM3" / "baseline_1gpu.json")
    attention = {r.get(keys.ATTENTION) for r in one_gpu.results} - {None}
    assert "triton" in attention and attention <= set(ATTENTION_BACKENDS)


def test_a_current_key_wins_over_a_retired_one() -> None:
    assert keys.normalise({"seq_len": 64, "context_length": 32})[keys.SEQ_LEN] == 64


def test_committed_histories_have_sequence_lengths_and_buckets() -> None:
    """The committed baselines were saved with the retired keys."""
    one_gpu = load_run(BENCHMARKS / "NVIDIA_H100_80GB_HBM3" / "baseline_1gpu.json")
    steps = [r for r in one_gpu.results if r.kind in ("end_to_end", "recipe")]
    assert steps and all(isinstance(r.get(keys.SEQ_LEN), int) for r in steps)
    two_gpu = load_run(BENCHMARKS / "NVIDIA_H200" / "baseline_2gpu.json")
    ddp = [r for r in two_gpu.results if r.kind == "ddp"]
    assert ddp and all(isinstance(r.get(keys.SEQ_LEN), int) and r.get(keys.SIZE) for r in ddp)
    assert any(isinstance(r.get(keys.BUCKET_SIZE_MB), int | float) for r in ddp)
