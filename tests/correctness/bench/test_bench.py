"""The timing primitive, FLOP accounting and workload construction."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from systems.bench import TimingStats, build_model_workload, time_steps
from systems.bench.metrics import BenchmarkResult, throughput_metrics, throughput_table
from systems.bench.workloads import forward_flops, workload_flops
from systems.model import MODEL_CONFIGS, get_config
from systems.runs.gate import Timing

TINY = MODEL_CONFIGS["tiny"]


def test_time_steps_runs_warmup_untimed_then_times_each_step() -> None:
    calls = []

    def step() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.01 if len(calls) > 2 else 0.2)  # slow warm-up must not be measured

    stats = time_steps(step, warmup=2, steps=4)
    assert len(calls) == 6 and len(stats.times) == 4 == len(stats.host_times)
    assert stats.min > 0.009 and stats.max < 0.15
    assert all(0.009 < h <= t for h, t in zip(stats.host_times, stats.times, strict=True))
    assert stats.min <= stats.median <= stats.max


def test_timing_stats_summary() -> None:
    stats = TimingStats((1.0, 2.0, 3.0, 6.0), host_times=(0.5, 0.5, 1.0, 2.0))
    assert stats.summary() == pytest.approx(
        {"mean": 3.0, "std": 2.160247, "median": 2.5, "min": 1.0, "max": 6.0,
         "host_median": 0.75}, rel=1e-6
    )
    assert TimingStats((4.0,)).std == 0.0
    assert TimingStats((4.0,)).host_median is None
    with pytest.raises(ValueError):
        TimingStats(())


@pytest.mark.parametrize(("warmup", "steps"), [(-1, 3), (0, 0)])
def test_time_steps_rejects_bad_counts(warmup: int, steps: int) -> None:
    with pytest.raises(ValueError):
        time_steps(lambda: None, warmup=warmup, steps=steps)


@pytest.mark.parametrize("seq_len", [16, 48])
def test_forward_flops_match_torch_flop_counter(seq_len: int) -> None:
    """Our analytic count equals what torch counts for the model's matmuls."""
    workload = build_model_workload(TINY, batch_size=2, seq_len=seq_len, mode="forward")
    tokens = torch.randint(TINY.vocab_size, (2, seq_len))
    with FlopCounterMode(display=False) as counter:
        workload.model(tokens)
    assert forward_flops(TINY, 2, seq_len) == counter.get_total_flops()


def test_mode_flop_multipliers() -> None:
    forward = workload_flops(TINY, 4, 64, "forward")
    assert workload_flops(TINY, 4, 64, "forward_backward") == 3 * forward
    assert workload_flops(TINY, 4, 64, "train_step") == 3 * forward


def test_2p7b_train_step_flops_are_about_six_n_t() -> None:
    config = get_config("2.7b")
    flops = workload_flops(config, 4, 512, "train_step")
    six_nt = 6 * config.num_parameters(include_embedding=False) * 4 * 512
    assert 1.0 < flops / six_nt < 1.05  # attention adds a few percent at ctx 512


@pytest.mark.parametrize("mode", ["forward", "forward_backward", "train_step"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_workload_steps_run_and_train(mode: str, precision: str) -> None:
    workload = build_model_workload(TINY, batch_size=2, seq_len=16, mode=mode,
                                    precision=precision)
    before = [p.detach().clone() for p in workload.model.parameters()]
    workload.step()
    workload.step()
    changed = any(not torch.equal(a, b) for a, b in zip(before, workload.model.parameters(),
                                                         strict=True))
    assert changed == (mode == "train_step")
    has_grads = all(p.grad is not None for p in workload.model.parameters())
    assert has_grads == (mode != "forward")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(mode="backward"), "unknown mode"),
        (dict(precision="fp8"), "unknown precision"),
        (dict(seq_len=TINY.max_seq_len + 1), "seq_len"),
        (dict(batch_size=0), "batch_size"),
        (dict(attention="nope"), "unknown attention"),
    ],
)
def test_bad_workload_arguments_are_clear_errors(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model_workload(TINY, **{"seq_len": 16, **kwargs})


def test_throughput_metrics() -> None:
    metrics = throughput_metrics(seconds=0.5, flops=2e12, tokens=1000, precision="bf16",
                                 device="cpu")
    assert metrics["tflops"] == pytest.approx(4.0)
    assert metrics["tokens_per_s"] == pytest.approx(2000.0)
    assert metrics["mfu"] is None  # no nominal peak for a CPU
    with pytest.raises(ValueError):
        throughput_metrics(seconds=0.0, flops=1.0, tokens=1, precision="fp32", device="cpu")


def test_throughput_table_shows_the_host_share_of_each_round() -> None:
    def result(name: str, mean: float, info: dict) -> BenchmarkResult:
        return BenchmarkResult(name, f"tests/perf/x.py::{name}", mean, Timing(mean, 0.0), info)

    table = throughput_table([
        result("launch_bound", 0.010, {"host_enqueue_s_median": 0.0095, "tflops": 1.5}),
        result("device_bound", 0.100, {"host_enqueue_s_median": 0.002}),
        result("no_host_time", 0.050, {}),
    ])
    header, _, *rows = table.splitlines()
    assert header.split()[-1] == "host"
    assert [row.split()[-1] for row in rows] == ["2%", "95%", "-"]
    assert rows[1].split()[2] == "1.5"
