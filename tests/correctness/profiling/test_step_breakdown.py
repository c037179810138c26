"""Step breakdown: sums and idle gap from synthetic profiler events, floors against an
independent count, and the CLI on the CPU."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from systems.bench.workloads import build_recipe_workload
from systems.model import MODEL_CONFIGS
from systems.model.recipes import get_recipe
from systems.profiling.cli import main
from systems.profiling.kernel_categories import CATEGORIES
from systems.profiling.step_breakdown import (
    Ceilings,
    TimedEvent,
    aggregate,
    breakdown_rows,
    busy_us,
    floor_seconds,
    optimizer_bytes,
    timed_events,
    top_kernel_rows,
)

TINY = MODEL_CONFIGS["tiny"]


def test_busy_time_counts_overlapping_spans_once() -> None:
    events = [TimedEvent("a", 0.0, 10.0), TimedEvent("b", 5.0, 10.0),  # 0..15
              TimedEvent("c", 20.0, 5.0), TimedEvent("d", 21.0, 1.0)]  # 20..25, d inside c
    assert busy_us(events) == pytest.approx(20.0)
    assert busy_us(list(reversed(events))) == pytest.approx(20.0)


def test_aggregate_sums_per_step_and_leaves_the_rest_as_idle_gap() -> None:
    # Two steps of 1 ms each; per step one gemm (300 us), one flash kernel (200 us), one
    # Adam kernel (100 us) and an unknown kernel (50 us), back to back on one stream.
    events = []
    for step in range(2):
        t = step * 1000.0
        for name, us in (("nvjet_gemm", 300.0), ("flash_fwd", 200.0),
                         ("_adamw_kernel", 100.0), ("some_kernel", 50.0)):
            events.append(TimedEvent(name, t, us))
            t += us
    breakdown = aggregate(events, steps=2, wall_s=1e-3)
    assert breakdown.category_s["matmul"] == pytest.approx(300e-6)
    assert breakdown.category_s["attention"] == pytest.approx(200e-6)
    assert breakdown.category_s["optimizer"] == pytest.approx(100e-6)
    assert breakdown.category_s["other"] == pytest.approx(50e-6)
    assert breakdown.category_s["loss"] == 0.0
    assert breakdown.summed_s == pytest.approx(650e-6)
    assert breakdown.idle_s == pytest.approx(350e-6)
    assert breakdown.events_per_step == 4
    rows = {r["category"]: r for r in breakdown_rows(breakdown, {"matmul": 150e-6})}
    assert list(rows) == [*CATEGORIES, "idle gap"]
    assert rows["matmul"]["over_floor"] == pytest.approx(2.0)
    assert rows["idle gap"]["share"] == pytest.approx(0.35)
    assert rows["loss"]["floor_ms"] is None
    top = top_kernel_rows(breakdown, count=2)
    assert [(r["kernel"], r["category"]) for r in top] == [("nvjet_gemm", "matmul"),
                                                             ("flash_fwd", "attention")]
    assert top[0]["ms"] == pytest.approx(0.3)
    assert top[1]["share"] == pytest.approx(0.2)


def test_aggregate_rejects_an_empty_profile_and_zero_steps() -> None:
    with pytest.raises(ValueError, match="no kernels"):
        aggregate([], steps=1, wall_s=1.0)
    with pytest.raises(ValueError, match="steps"):
        aggregate([TimedEvent("k", 0.0, 1.0)], steps=0, wall_s=1.0)


def _event(name: str, device: str, start: float, end: float, self_us: float = 0.0,
           annotation: bool = False) -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=f"DeviceType.{device}",
                           time_range=SimpleNamespace(start=start, end=end),
                           self_cpu_time_total=self_us, is_user_annotation=annotation)


def test_timed_events_take_device_activity_or_cpu_self_time() -> None:
    events = [_event("aten::mm", "CPU", 0, 10, self_us=4), _event("forward", "CPU", 0, 50, 9),
              _event("my_range", "CPU", 0, 50, 3, annotation=True),
              _event("aten::empty", "CPU", 0, 1, self_us=0),
              _event("nvjet_gemm", "CUDA", 5, 12)]
    assert timed_events(events, on_gpu=True) == [TimedEvent("nvjet_gemm", 5, 7)]
    assert timed_events(events, on_gpu=False) == [TimedEvent("aten::mm", 0, 4)]


def test_floors_match_a_count_from_the_model_itself() -> None:
    config = TINY
    batch, seq = 2, 16
    workload = build_recipe_workload(
        config, get_recipe("pytorch_baseline", compiled=False, cuda_graph=False,
                           precision="fp32"), batch_size=batch, seq_len=seq)
    linear_weights = sum(m.weight.numel() for m in workload.model.modules()
                         if isinstance(m, torch.nn.Linear))  # projections, SwiGLU, LM head
    dense = 3 * 2 * batch * seq * linear_weights  # forward + backward, 2 FLOPs per MAC
    # QK^T and PV over the causal half of the scores, per head and layer; backward 2.5x.
    attention = 3.5 * config.num_layers * batch * config.num_heads * 2 * (
        2 * config.head_dim * seq * seq / 2)
    floors = floor_seconds(workload, Ceilings(1e12, 1e9, copy_measured=False))
    assert floors["matmul"] == pytest.approx(dense / 1e12)
    assert floors["attention"] == pytest.approx(attention / 1e12)
    parameters = sum(p.numel() for p in workload.model.parameters())
    assert parameters == config.num_parameters()
    # fp32 weights: read and write weights and two moments, read the gradient.
    assert floors["optimizer"] == pytest.approx(28 * parameters / 1e9)


@pytest.mark.interpreter
def test_bf16_parameters_over_split_masters_move_two_bytes_less_per_weight() -> None:
    workload = build_recipe_workload(
        TINY, get_recipe("optimized", compiled=False, cuda_graph=False, attention="sdpa"),
        batch_size=1, seq_len=8)
    assert {p.dtype for p in workload.model.parameters()} == {torch.bfloat16}
    # The bf16 gradient read; the bf16 parameter and its int16 low bits read and written
    # where fp32 weights are read and written (8 bytes) and a gradient read (4).
    assert optimizer_bytes(workload) == 26 * TINY.num_parameters()


def test_breakdown_cli_on_cpu_turns_the_graph_off_and_writes_table_and_json(
        tmp_path, capsys) -> None:
    code = main(["breakdown", "--recipe", "pytorch_baseline", "--option", "compiled=false",
                 "--option", "precision=fp32", "--size", "tiny", "--seq-len", "16",
                 "--batch-size", "1", "--steps", "2", "--copy-gbps", "10",
                 "--device", "cpu", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "breakdown.json").read_text())
    assert record["measured"].startswith("CPU ops")
    assert record["workload"]["cuda_graph"] is False
    assert record["copy_bandwidth"] == "given" and record["copy_gbps"] == 10
    rows = {r["category"]: r for r in record["rows"]}
    assert set(rows) == {*CATEGORIES, "idle gap"}
    assert rows["matmul"]["ms"] > 0 and rows["attention"]["ms"] > 0
    assert rows["optimizer"]["ms"] > 0  # torch's foreach AdamW off CUDA
    summed = sum(r["ms"] for name, r in rows.items() if name != "idle gap")
    assert summed == pytest.approx(record["summed_ms"])
    table = (tmp_path / "breakdown.md").read_text()
    assert "| idle gap |" in table and "CPU ops' self time" in table
    top = record["top_kernels"]
    assert 0 < len(top) <= 30 and top[0]["ms"] >= top[-1]["ms"] > 0
    assert f"| {top[0]['kernel'][:80]}" in table
    assert "| matmul |" in capsys.readouterr().out


def test_breakdown_cli_rejects_unknown_settings(tmp_path, capsys) -> None:
    assert main(["breakdown", "--size", "tiny", "--option", "turbo=true",
                 "--out", str(tmp_path)]) == 2
    assert "--option" in capsys.readouterr().err
