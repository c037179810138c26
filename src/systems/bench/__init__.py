"""Timing primitives and workload builders shared by the perf tests and the CLI."""

from systems.bench.metrics import throughput_metrics
from systems.bench.timing import TimingStats, synchronize, time_steps
from systems.bench.workloads import ModelWorkload, build_model_workload
from systems.model.train_step import MODES, PRECISIONS

__all__ = [
    "MODES", "PRECISIONS", "ModelWorkload", "TimingStats", "build_model_workload",
    "synchronize", "throughput_metrics", "time_steps",
]
