"""The timing core (systems.bench.timing, its clocks in systems.common.clock): what a round
is, warm-up, the paused garbage collector, enqueue time, the injected slowdown, marks and
device time. On the CPU the device's share of a round is played by a patched
`synchronize`."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from systems.bench import timing
from systems.bench.timing import (
    DEVICE,
    WALL,
    RoundTimer,
    StepTimer,
    TimingStats,
    busy_per_round,
    busy_seconds,
    device_busy_rounds,
    device_time,
    interleaved_device_time,
    interleaved_rounds,
    release_cupti_after_profiling,
    time_steps,
)
from systems.common.clock import mark, seconds_between
from systems.model.cuda_graph import CapturedStep

SRC = Path(__file__).resolve().parents[3] / "src"

def test_a_round_of_a_sleeping_step_measures_the_sleep() -> None:
    stats = time_steps(lambda: time.sleep(0.05), warmup=1, steps=5)
    assert stats.kind == WALL
    assert stats.min >= 0.05 and stats.median < 0.05 * 1.3


def test_stats_carry_their_kind() -> None:
    assert TimingStats((1.0,), kind=DEVICE).to_dict()["kind"] == DEVICE
    assert TimingStats((1.0,)).to_dict()["kind"] == WALL
    with pytest.raises(ValueError, match="kind"):
        TimingStats((1.0,), kind="events")


def test_warmup_rounds_run_first_untimed_and_end_with_a_synchronize(monkeypatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(timing, "synchronize", lambda device: events.append("sync"))

    def step() -> None:
        events.append("step")
        # Warm-up calls are slow (compilation would happen there): none may be measured.
        time.sleep(0.2 if events.count("step") <= 2 else 0.01)

    stats = time_steps(step, warmup=2, steps=3)
    # Work queued before does not count; then every round, warm-up too, ends synchronised.
    assert events == ["sync"] + ["step", "sync"] * 5
    assert len(stats.times) == 3 == len(stats.host_times)
    assert stats.max < 0.15


def test_enqueue_time_ends_when_step_returns_and_the_round_at_the_synchronize(
        monkeypatch) -> None:
    # A step that only queues work: the device (here: the synchronize) takes 50 ms.
    monkeypatch.setattr(timing, "synchronize", lambda device: time.sleep(0.05))
    stats = time_steps(lambda: None, warmup=0, steps=3)
    assert stats.host_median < 0.01
    assert stats.min >= 0.05 and stats.median < 0.05 * 1.3
    assert stats.host_median == statistics.median(stats.host_times)


def test_garbage_collector_is_paused_in_timed_rounds_only() -> None:
    seen: list[bool] = []
    timer = RoundTimer(lambda: seen.append(gc.isenabled()))
    timer.first_call()
    timer.measure(warmup=2, rounds=3)
    assert seen == [True, True, True, False, False, False]
    assert gc.isenabled()


def test_garbage_collector_is_enabled_again_after_a_failing_round() -> None:
    calls = []

    def step() -> None:
        calls.append(gc.isenabled())
        if len(calls) == 3:
            raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError, match="the step failed"):
        time_steps(step, warmup=1, steps=5)
    assert calls == [True, False, False]
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        time_steps(lambda: None, warmup=1, steps=2)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_driver_calls_the_rounds_and_the_core_keeps_their_times() -> None:
    """What the pytest fixture does: pytest-benchmark's pedantic calls the core's rounds."""
    calls = []
    driven = []

    def drive(timed_round, rounds: int) -> None:
        for _ in range(rounds):
            driven.append(timed_round())

    timer = RoundTimer(lambda: (calls.append(1), time.sleep(0.02)))
    stats = timer.measure(warmup=2, rounds=4, drive=drive)
    assert len(calls) == 6 and stats.times == tuple(driven)
    assert all(t >= 0.02 for t in stats.times)


def test_the_injected_host_slowdown_adds_host_time_to_timed_rounds_only() -> None:
    starts: list[float] = []
    timer = RoundTimer(lambda: (starts.append(time.perf_counter()), time.sleep(0.1)),
                       host_slowdown=0.5)
    stats = timer.measure(warmup=2, rounds=3)
    assert starts[1] - starts[0] < 0.14  # a warm-up round is not slowed
    # Inside the host's part of the round: its enqueue time grows with it.
    assert min(stats.host_times) >= 0.15 and stats.median < 0.15 * 1.2
    assert starts[3] - starts[2] >= 0.15


def test_busy_time_is_the_union_of_a_rounds_work_spans() -> None:
    # Two overlapping spans count once, a gap not at all; ns in, seconds out.
    assert busy_seconds([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)
    assert busy_seconds([]) == 0.0
    rounds = [(0, 100), (100, 200), (200, 300)]
    work = [(10, 20), (15, 30), (120, 130), (250, 290), (400, 410)]  # the last: no round's
    assert busy_per_round(rounds, work) == pytest.approx([20e-9, 10e-9, 40e-9])


def test_the_device_clock_counts_a_rounds_work_and_not_its_host_gaps() -> None:
    """The profiler glue, on the CPU: CPU matmuls stand in for kernels; each round also
    sleeps 30 ms on the host, which the clock must leave out."""
    a = torch.randn(64, 64)
    walls: list[float] = []

    def run_round() -> None:
        start = time.perf_counter()
        time.sleep(0.015)
        a @ a
        time.sleep(0.015)
        walls.append(time.perf_counter() - start)

    busy = device_busy_rounds(run_round, 3, is_work=lambda e: e.name() == "aten::mm")
    assert len(busy) == 3 and all(b > 0 for b in busy)
    assert all(b < wall - 0.029 for b, wall in zip(busy, walls, strict=True))
    # On the CPU there is no device work: a round's device clock is zero.
    timer = RoundTimer(lambda: a @ a)
    assert timer.measure(warmup=1, rounds=2, device_rounds=2).device_busy == (0.0, 0.0)


@pytest.mark.gpu
def test_injected_device_work_adds_device_time_and_not_host_time() -> None:
    device = torch.device("cuda")
    x = torch.randn(4096, 4096, device=device)
    plain = RoundTimer(lambda: x @ x, device).measure(warmup=3, rounds=5, device_rounds=5)
    added = RoundTimer(lambda: x @ x, device, device_work=0.08).measure(
        warmup=3, rounds=5, device_rounds=5)
    ratio = statistics.median(added.device_busy) / statistics.median(plain.device_busy)
    assert 1.05 < ratio < 1.12
    assert added.host_median < plain.host_median * 1.5 + 20e-6


def test_first_call_is_one_round_kept_apart() -> None:
    timer = RoundTimer(lambda: time.sleep(0.03))
    assert 0.03 <= timer.first_call() < 0.045
    assert len(timer.measure(warmup=0, rounds=2).times) == 2


@pytest.mark.parametrize(("warmup", "rounds"), [(-1, 3), (0, 0)])
def test_measure_rejects_bad_counts(warmup: int, rounds: int) -> None:
    with pytest.raises(ValueError, match="warmup >= 0 and rounds >= 1"):
        RoundTimer(lambda: None).measure(warmup=warmup, rounds=rounds)


def test_interleaved_rounds_alternate_the_order_and_keep_each_steps_times() -> None:
    calls: list[str] = []
    steps = {name: (lambda name=name: (calls.append(name), time.sleep(0.01 if name == "a"
                                                                       else 0.02)))
             for name in "abc"}
    stats = interleaved_rounds(steps, warmup=1, rounds=4)
    assert calls[:3] == ["a", "b", "c"]  # each step's warm-up, in turn
    assert calls[3:] == [*"abc", *"cba", *"abc", *"cba"]
    assert {name: len(s.times) for name, s in stats.items()} == {"a": 4, "b": 4, "c": 4}
    assert stats["a"].median < stats["b"].median  # each keeps its own step's times
    assert all(s.kind == WALL for s in stats.values())


def test_interleaved_rounds_pause_the_collector_and_refuse_bad_input() -> None:
    seen: list[bool] = []
    interleaved_rounds({"a": lambda: seen.append(gc.isenabled())}, warmup=1, rounds=2)
    assert seen == [True, False, False] and gc.isenabled()
    with pytest.raises(ValueError, match="at least one step"):
        interleaved_rounds({}, warmup=0, rounds=1)
    with pytest.raises(ValueError, match="warmup >= 0 and rounds >= 1"):
        interleaved_rounds({"a": lambda: None}, warmup=0, rounds=0)


def test_a_driver_that_runs_no_round_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one measured step"):
        RoundTimer(lambda: None).measure(warmup=0, rounds=2,
                                         drive=lambda timed_round, rounds: None)


def test_rounds_replaying_a_captured_graph_are_device_time() -> None:
    # CapturedStep needs CUDA to be built; its kind depends only on whether it has a graph.
    captured = CapturedStep.__new__(CapturedStep)
    captured.graph = None
    assert timing.round_kind(captured) == WALL  # warm-up and capture calls are eager
    captured.graph = object()
    assert timing.round_kind(captured) == DEVICE
    assert timing.round_kind(lambda: None) == WALL


def test_marks_on_the_cpu_read_the_host_clock() -> None:
    start = mark("cpu")
    time.sleep(0.03)
    end = mark("cpu")
    assert start.kind == end.kind == WALL
    assert 0.03 <= seconds_between(start, end) < 0.045


def test_step_timer_splits_a_step_into_phases() -> None:
    timer = StepTimer(torch.device("cpu"))
    time.sleep(0.02)
    timer.mark("first")
    time.sleep(0.04)
    timer.mark("second")
    phases = timer.intervals()
    assert timer.kind == WALL
    assert 0.02 <= phases["first"] < 0.035 and 0.04 <= phases["second"] < 0.055
    assert phases["total"] == pytest.approx(phases["first"] + phases["second"])


def test_step_timer_needs_a_mark_before_intervals() -> None:
    with pytest.raises(ValueError, match="mark"):
        StepTimer(torch.device("cpu")).intervals()


def test_device_time_needs_a_cuda_device(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        device_time(lambda: None)


def test_device_time_is_do_bench_samples_in_seconds(monkeypatch) -> None:
    """The glue only (do_bench itself needs a GPU): its per-run samples, in ms, become
    device-time stats in seconds, with the warm-up and repetition times passed on."""
    import triton.testing

    asked = {}

    def fake_do_bench(fn, *, warmup, rep, return_mode):
        asked.update(fn=fn, warmup=warmup, rep=rep, return_mode=return_mode)
        return [1.0, 2.0, 6.0]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)

    def step() -> None:
        pass

    stats = device_time(step, warmup_ms=100, rep_ms=300)
    assert asked == {"fn": step, "warmup": 100, "rep": 300, "return_mode": "all"}
    assert stats.kind == DEVICE and stats.times == (1e-3, 2e-3, 6e-3)
    assert stats.median == pytest.approx(2e-3) and stats.mean == pytest.approx(3e-3)


def test_interleaved_device_time_alternates_and_keeps_each_rounds_median(monkeypatch) -> None:
    """Rounds of do_bench taken in turn (A B, B A, ...): each function keeps its own
    per-round medians, in order, in seconds."""
    import triton.testing

    calls: list[str] = []
    samples_ms = {"a": iter([[1.0, 3.0, 2.0], [4.0], [5.0, 7.0]]),
                  "b": iter([[10.0], [20.0, 40.0, 30.0], [60.0]])}

    def fake_do_bench(fn, *, warmup, rep, return_mode):
        assert (warmup, rep, return_mode) == (50, 200, "all")
        return next(samples_ms[fn()])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    fns = {name: (lambda name=name: (calls.append(name), name)[1]) for name in "ab"}
    medians = interleaved_device_time(fns, rounds=3, warmup_ms=50, rep_ms=200)
    assert calls == [*"ab", *"ba", *"ab"]
    assert medians == {"a": pytest.approx([2e-3, 4e-3, 6e-3]),
                       "b": pytest.approx([10e-3, 30e-3, 60e-3])}
    with pytest.raises(ValueError, match="at least one function"):
        interleaved_device_time({}, rounds=1)
    with pytest.raises(ValueError, match="rounds >= 1"):
        interleaved_device_time(fns, rounds=0)


class FakeEvent:
    """Stands in for torch.cuda.Event on the CPU: its time is a fake device clock, readable
    only once it was waited for (elapsed_time of an event not yet reached is an error)."""

    device_clock_ms = 0.0

    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing
        self.at_ms: float | None = None
        self.waited = False

    def record(self, stream: object) -> None:
        self.at_ms = FakeEvent.device_clock_ms

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert end.waited, "read before the device reached the end event"
        return end.at_ms - self.at_ms


def test_step_timer_on_cuda_reads_events_in_seconds(monkeypatch) -> None:
    """The CUDA path's glue only (no GPU here): marks are events on the current stream,
    read in seconds after waiting for the last one."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: "stream")
    monkeypatch.setattr(FakeEvent, "device_clock_ms", 10.0)
    timer = StepTimer(torch.device("cuda"))
    monkeypatch.setattr(FakeEvent, "device_clock_ms", 12.5)
    timer.mark("backward")
    monkeypatch.setattr(FakeEvent, "device_clock_ms", 20.0)
    timer.mark("optimizer")
    assert timer.kind == DEVICE
    assert timer.intervals() == pytest.approx(
        {"backward": 2.5e-3, "optimizer": 7.5e-3, "total": 10e-3})
    with pytest.raises(ValueError, match="wall mark"):
        seconds_between(mark("cuda"), mark("cpu"))


@pytest.mark.parametrize(("cuda", "preset", "expected"), [
    ("13.0", None, "1"),   # new enough: the profiler detaches CUPTI after its session
    ("12.6", None, "1"),
    ("12.4", None, None),  # older CUDA crashes re-attaching with graphs alive: left attached
    (None, None, None),    # a CPU build has no CUPTI
    ("13.0", "0", "0"),    # the user's own setting wins
])
def test_cupti_is_released_after_profiling_where_safe(monkeypatch, cuda, preset, expected):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    if preset is not None:
        monkeypatch.setenv("TEARDOWN_CUPTI", preset)
    release_cupti_after_profiling()
    assert os.environ.get("TEARDOWN_CUPTI") == expected


# Host enqueue of a launch-bound step before and after a device-clock session in one
# process, and a graph captured before that session replayed after it (run in a fresh
# interpreter, so that no earlier profiler session of this test process counts).
_CUPTI_PROBE = """
import json, statistics, torch
from systems.bench.timing import RoundTimer, device_busy_rounds
from systems.model.cuda_graph import CapturedStep
x = torch.randn(64, device="cuda")
def launches():
    for _ in range(300):
        x.add_(1e-3)
def host_median():
    return RoundTimer(launches, "cuda").measure(warmup=5, rounds=60).host_median
y = torch.randn(1024, device="cuda")
captured = CapturedStep(lambda: y * 2 + 1, warmup=1)
captured(); captured()  # warm-up, capture and a first replay
before = host_median()
device_busy_rounds(lambda: (launches(), torch.cuda.synchronize()), 3)
y.copy_(torch.arange(1024.0, device="cuda"))
replayed = captured().clone()
after = host_median()
print(json.dumps({"before": before, "after": after,
                  "replay_ok": bool(torch.equal(replayed, y * 2 + 1))}))
"""


def _cupti_probe(teardown: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    if teardown is not None:
        env["TEARDOWN_CUPTI"] = teardown
    result = subprocess.run([sys.executable, "-c", _CUPTI_PROBE], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_a_device_clock_session_leaves_later_host_launches_as_fast_as_before() -> None:
    """After the profiler's session the host launches as fast as before it (CUPTI is
    detached), and a graph captured before the session replays correctly after it. Left
    attached (TEARDOWN_CUPTI=0), the same probe is slower after the session: the check can
    tell the two apart on this machine."""
    released = _cupti_probe(None)
    attached = _cupti_probe("0")
    assert released["replay_ok"] and attached["replay_ok"]
    released_ratio = released["after"] / released["before"]
    attached_ratio = attached["after"] / attached["before"]
    assert released_ratio < 1.15, (released, attached)
    assert attached_ratio > 1.15, (released, attached)
