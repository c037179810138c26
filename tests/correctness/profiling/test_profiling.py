"""Kernel summaries from real torch.profiler runs (CPU ops here), snapshot timelines, CLI."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from systems.bench.workloads import build_model_workload
from systems.common import nvtx
from systems.model import get_config
from systems.profiling import nvtx_range
from systems.profiling.cli import main
from systems.profiling.kernel_summary import (
    ATTENTION_REGIONS,
    PHASES,
    collect_timed_ops,
)
from systems.profiling.timeline import (
    active_timeline,
    allocation_site,
    largest_allocations,
    plot_timeline,
)


@pytest.fixture(scope="module")
def train_step_ops():
    workload = build_model_workload(get_config("tiny"), batch_size=2, seq_len=32)
    workload.step()  # warm-up outside the trace
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        workload.step()
    return collect_timed_ops(prof.events(), on_gpu=False)


def test_every_phase_and_attention_region_is_attributed(train_step_ops) -> None:
    assert {op.phase for op in train_step_ops} >= set(PHASES)
    by_region = {r: [op.op for op in train_step_ops if op.region == r]
                 for r in ATTENTION_REGIONS}
    assert "aten::bmm" in by_region["attention_scores"] + by_region["attention_final_matmul"]
    assert any("softmax" in name for name in by_region["attention_softmax"])
    # AdamW's foreach updates are elementwise and happen only in the optimizer step.
    foreach = [op for op in train_step_ops if op.op.startswith("aten::_foreach_")]
    assert foreach and {op.phase for op in foreach} == {"optimizer_step"}
    assert {op.kind for op in foreach} == {"elementwise"}


def test_nvtx_range_is_visible_to_torch_profiler() -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof, nvtx_range("my_range"):
        torch.ones(4).sum()
    assert "my_range" in {e.name for e in prof.events()}


def test_nvtx_range_leaves_compiled_code_whole(monkeypatch) -> None:
    """Inside torch.compile a range pushes nothing: Dynamo cannot trace the NVTX calls and
    split the graph around every range. Here CUDA's NVTX is stood in for by calls that
    Dynamo must not trace either, and fullgraph=True fails on any split."""
    pushed = []
    monkeypatch.setattr(nvtx, "_nvtx_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", torch._dynamo.disable(pushed.append))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", torch._dynamo.disable(lambda: None))

    def step(x: torch.Tensor) -> torch.Tensor:
        with nvtx_range("attention"):
            return (x * 2).sum()

    torch._dynamo.reset()
    assert torch.compile(step, backend="eager", fullgraph=True)(torch.ones(4)).item() == 8.0
    assert pushed == []
    step(torch.ones(4))  # outside torch.compile the range is pushed
    assert pushed == ["attention"]


def test_compute_cli_on_cpu_writes_summary_and_trace(tmp_path, capsys) -> None:
    code = main(["compute", "--size", "tiny", "--seq-len", "32", "--mode", "train_step",
                 "--batch-size", "2", "--warmup", "1", "--steps", "1", "--device", "cpu",
                 "--out", str(tmp_path)])
    assert code == 0
    summary = (tmp_path / "profile_summary.md").read_text()
    assert "CPU ops" in summary and "| optimizer_step |" in summary and "| softmax |" in summary
    trace = tmp_path / "trace_tiny_ctx32_train_step_fp32.json.gz"
    assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_memory_cli_without_cuda_explains_and_fails(tmp_path, capsys) -> None:
    code = main(["memory", "--size", "2.7b", "--seq-len", "128", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2
    assert "need a CUDA GPU" in captured.err
    assert "| 2.7b | 4 | 128 | fp32 | 5.24 |" in captured.out  # the residual stream, in MB


def _event(action: str, addr: int, size: int, t: int, filename: str = "x.py") -> dict:
    return {"action": action, "addr": addr, "size": size, "time_us": t,
            "frames": [{"filename": "/lib/torch/nn/modules/linear.py", "line": 1,
                        "name": "forward"},
                       {"filename": f"/repo/src/systems/model/{filename}", "line": 42,
                        "name": "forward"}]}


def _synthetic_snapshot() -> dict:
    """A test fixture in the format of torch.cuda.memory._snapshot(): 100 bytes allocated
    before recording, then 300 and 500 allocated, 300 freed."""
    trace = [_event("alloc", 1, 300, 1000), _event("alloc", 2, 500, 2000, "layers.py"),
             _event("free_requested", 1, 300, 2500), _event("free_completed", 1, 300, 3000)]
    segments = [{"blocks": [{"size": 100, "state": "active_allocated"},
                            {"size": 500, "state": "active_allocated"},
                            {"size": 300, "state": "inactive"}]}]
    return {"segments": segments, "device_traces": [trace]}


def test_timeline_replays_from_memory_allocated_before_recording(tmp_path) -> None:
    timeline = active_timeline(_synthetic_snapshot())
    assert timeline.active_bytes == [400, 900, 900, 600]
    assert timeline.times_ms == [0.0, 1.0, 1.5, 2.0] and timeline.time_is_wall_clock
    assert timeline.peak_bytes == 900
    path = plot_timeline(timeline, "test", tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_largest_allocations_name_our_code() -> None:
    largest = largest_allocations(_synthetic_snapshot(), top=1)
    assert [(a.size, a.count) for a in largest] == [(500, 1)]
    assert largest[0].where == "systems/model/layers.py:42 in forward"
    assert allocation_site([]) == "(no user frame recorded)"
