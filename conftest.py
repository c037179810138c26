"""Shared pytest fixtures and options: device choice, perf profiles, a synchronised benchmark.

Perf profiles (`--perf-profile`): `smoke` runs tiny CPU-sized cases (the default without a
GPU), `quick` a few minutes of representative GPU cases (the default with one), `full` the
whole matrix. A perf test module opts in by taking a `perf_case` argument and defining
`perf_cases(profile) -> list` of cases with an `id` attribute.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from systems import triton_runtime
from systems.bench.hardware import device_slug, gpu_count, machine_description
from systems.bench.metrics import (
    allocated_memory_bytes,
    is_out_of_memory,
    out_of_memory_reason,
    peak_memory_bytes,
    reset_peak_memory,
    throughput_metrics,
)
from systems.bench.timing import synchronize

PERF_PROFILES = ("smoke", "quick", "full")
_DEFAULT_STORAGE = "file://./.benchmarks"
ROOT = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("systems")
    group.addoption("--perf-profile", choices=PERF_PROFILES, default=None,
                    help="perf case set: smoke (CPU-sized), quick, full "
                         "(default: quick with a GPU, smoke without)")
    group.addoption("--device", default=None,
                    help="torch device for tests (default: cuda if available, else cpu)")


def pytest_configure(config: pytest.Config) -> None:
    # Histories are kept per GPU model, so an H100 run is never compared with an H200 run.
    if getattr(config.option, "benchmark_storage", None) == _DEFAULT_STORAGE:
        config.option.benchmark_storage = f"file://{ROOT / '.benchmarks' / device_slug()}"


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info.update(machine_description())


def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    # A checkout copied without its .git (e.g. to a GPU box) can still name its commit.
    commit = os.environ.get("SYSTEMS_COMMIT")
    if commit:
        output_json["commit_info"] = {**output_json.get("commit_info", {}), "id": commit,
                                      "error": None}


def perf_profile(config: pytest.Config) -> str:
    chosen = config.getoption("perf_profile")
    return chosen or ("quick" if torch.cuda.is_available() else "smoke")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "perf_case" not in metafunc.fixturenames:
        return
    factory = getattr(metafunc.function, "perf_cases", None) or metafunc.module.perf_cases
    cases = factory(perf_profile(metafunc.config))
    metafunc.parametrize("perf_case", cases, ids=[case.id for case in cases])


def pytest_runtest_setup(item: pytest.Item) -> None:
    gpus = gpu_count()
    if item.get_closest_marker("gpu") and gpus < 1:
        pytest.skip("needs a CUDA GPU")
    if item.get_closest_marker("multigpu") and gpus < 2:
        pytest.skip(f"needs 2+ CUDA GPUs, found {gpus}")
    if item.get_closest_marker("interpreter") and not triton_runtime.INTERPRETED:
        pytest.skip("runs Triton kernels on the CPU: needs Triton's interpreter (a CPU-only "
                    "torch, or TRITON_INTERPRET=1 for the whole run)")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    chosen = request.config.getoption("device")
    return torch.device(chosen or ("cuda" if torch.cuda.is_available() else "cpu"))


@pytest.fixture(scope="session")
def profile(request: pytest.FixtureRequest) -> str:
    return perf_profile(request.config)


class SynchronizedBenchmark:
    """pytest-benchmark's `benchmark`, made correct for asynchronous GPU work.

    Every timed round ends with a device synchronize; warm-up rounds are explicit and
    untimed; peak memory and throughput are written to `extra_info`; a CUDA out-of-memory
    error becomes a skip whose reason names the workload.
    """

    def __init__(self, benchmark, device: torch.device) -> None:
        self.benchmark = benchmark
        self.device = device

    def __call__(
        self,
        step: Callable[[], object],
        *,
        warmup: int,
        rounds: int,
        precision: str,
        flops: float | None = None,
        tokens: int | None = None,
        info: dict[str, object] | None = None,
        cold_start: bool = False,
    ) -> None:
        """`cold_start`: time the very first call on its own (JIT, autotuning and
        compilation happen there) as `extra_info["cold_start_s"]`, before the warm-up and
        before peak memory is reset."""

        enqueue_seconds: list[float] = []

        def timed_round() -> None:
            start = time.perf_counter()
            step()
            enqueue_seconds.append(time.perf_counter() - start)
            synchronize(self.device)

        extra = self.benchmark.extra_info
        extra.update(info or {})
        extra.update(precision=precision, warmup_rounds=warmup, device=str(self.device))
        synchronize(self.device)
        try:
            if cold_start:
                start = time.perf_counter()
                timed_round()
                extra["cold_start_s"] = time.perf_counter() - start
            reset_peak_memory(self.device)
            # The peak includes what was allocated before timing (model, inputs, and anything
            # an earlier case left behind): record that baseline so a reader can tell them apart.
            extra["memory_allocated_before_bytes"] = allocated_memory_bytes(self.device)
            self.benchmark.pedantic(timed_round, warmup_rounds=warmup, rounds=rounds,
                                    iterations=1)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            release_device_memory()
            pytest.skip(out_of_memory_reason(error))
        # Host time until step() returned, median over the timed rounds: near the round's
        # time, the device waited on the host (launch-bound) rather than the other way round.
        if len(enqueue_seconds) >= rounds:
            extra["host_enqueue_s_median"] = statistics.median(enqueue_seconds[-rounds:])
        extra["peak_memory_bytes"] = peak_memory_bytes(self.device)
        extra["peak_memory_gib"] = (
            None if extra["peak_memory_bytes"] is None else extra["peak_memory_bytes"] / 2**30
        )
        stats = getattr(self.benchmark, "stats", None)
        if stats is None:  # --benchmark-disable: the step ran once, untimed
            return
        extra.update(throughput_metrics(seconds=stats.stats.mean, flops=flops, tokens=tokens,
                                        precision=precision, device=self.device))


def release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.fixture
def synced_benchmark(benchmark, device: torch.device):
    yield SynchronizedBenchmark(benchmark, device)
    release_device_memory()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    session = getattr(config, "_benchmarksession", None)
    finished = [b for b in getattr(session, "benchmarks", []) if b]
    if not finished:
        return
    from systems.bench.summary import throughput_table

    terminalreporter.write_sep("-", f"throughput ({device_slug()})")
    terminalreporter.write_line(
        throughput_table((b.name, b.stats.mean, b.extra_info) for b in finished)
    )
    skipped = terminalreporter.stats.get("skipped", [])
    oom = [r for r in skipped if "out of memory" in str(r.longrepr)]
    for report in oom:
        terminalreporter.write_line(f"{report.nodeid}: out of memory (recorded as skip)")
