"""Distributed benchmarks: all-reduce bandwidth, data-parallel train steps, sharding.

Ranks are long-lived worker processes (a RankPool per world size and backend). Each
benchmark round sends one command to every rank and waits for all of them: one round is
one synchronised distributed operation, timed by the timing core (`synced_benchmark`) as
every perf case is, on the host (the parent owns no device: the ranks do), so it is real
wall time of real work (plus about a millisecond of inter-process messaging). Each rank
also times its part with CUDA events (host clocks on CPU); extra_info holds the max over
ranks of those per-rank times. How a variant compares with training alone ("none") is
read from the saved run by the report, so no case depends on another having run first.

Profiles: `smoke` is CPU/gloo with a tiny model (world size 2; all-reduce at 1 MB, world
sizes 2, 4 and 6); `quick` and `full` use every visible GPU for the train steps (run with
CUDA_VISIBLE_DEVICES=0,1 for world size 2) and world sizes 2, 4, 6, 8 (then 16, 32, ...)
for the all-reduce, as far as the GPUs go.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import pytest
import torch

from systems.bench.distributed.allreduce import bandwidths, timed_allreduces
from systems.bench.distributed.train_step import (
    TrainSpec,
    setup_train,
    teardown_train,
    train_round,
)
from systems.bench.metrics import is_out_of_memory
from systems.common.hardware import gpu_count
from systems.distributed import RankError, RankPool
from systems.runs import keys

MB = 10**6


def _world_sizes() -> list[int]:
    """2, 4, 6 and 8 processes where the GPUs allow, then powers of two beyond 8."""
    count = gpu_count()
    sizes = [n for n in (2, 4, 6, 8) if n <= count]
    n = 16
    while n <= count:
        sizes.append(n)
        n *= 2
    return sizes


@dataclass(frozen=True)
class AllReduceCase:
    backend: str
    world_size: int
    size_mb: int
    rounds: int = 5
    iterations: int = 10  # all-reduces per round, each timed on every rank

    @property
    def id(self) -> str:
        device = "gpu" if self.backend == "nccl" else "cpu"
        return f"{self.backend}-{device}-world{self.world_size}-{self.size_mb}MB"


def allreduce_cases(profile: str) -> list[AllReduceCase]:
    if profile == "smoke":
        return [AllReduceCase("gloo", n, 1, rounds=2, iterations=3) for n in (2, 4, 6)]
    sizes = (1, 10, 100, 1000)
    cases = [AllReduceCase("nccl", n, s) for n in _world_sizes() for s in sizes]
    gloo_sizes = sizes if profile == "full" else sizes[:3]  # gloo at 1 GB takes seconds
    gloo = [AllReduceCase("gloo", n, s, rounds=3, iterations=3) for n in (2, 4)
            for s in gloo_sizes]
    if profile == "quick":
        # A CPU collective times the host's CPU, which no GPU clock can gate: the quick
        # profile (every GPU's baseline) keeps one, its bandwidth beside the GPU cases.
        gloo = [case for case in gloo if (case.world_size, case.size_mb) == (2, 100)]
    return cases + gloo


@dataclass(frozen=True)
class TrainCase:
    spec: TrainSpec
    world_size: int
    backend: str
    warmup: int = 2
    rounds: int = 5

    @property
    def id(self) -> str:
        s = self.spec
        parts = [s.size, f"b{s.batch_per_rank}", f"ctx{s.seq_len}", f"world{self.world_size}",
                 s.variant]
        if s.variant == "bucketed":
            parts.append(f"{s.bucket_size_mb:g}MB")
        if s.optimizer != "adamw":
            parts.append(s.optimizer)
        return "-".join(parts)


def train_cases(profile: str) -> list[TrainCase]:
    if profile == "smoke":
        size, batch, seq_len, world, backend = "tiny", 2, 32, 2, "gloo"
        buckets: tuple[float, ...] = (0.1,)
    else:
        size, batch, seq_len, world, backend = "xl", 8, 128, gpu_count(), "nccl"
        # The bucket-size sweep is a study; the quick profile gates one bucket size.
        buckets = (1, 10, 100, 1000) if profile == "full" else (100,)
        if world < 2:
            return []
    variants = [("none", None), ("torch_ddp", None), ("naive", None), ("flat", None),
                ("individual", None), *(("bucketed", b) for b in buckets),
                ("fsdp", None), ("torch_fsdp2", None)]
    specs = [TrainSpec(v, size, batch, seq_len, bucket_size_mb=b) for v, b in variants]
    # The optimizer comparison runs on one wrapper. The sharded optimizers cannot step a
    # bucket alone, so their step follows backward where our AdamW's default steps each
    # bucket as its all-reduce lands (each case records `early_step`).
    specs += [TrainSpec("bucketed", size, batch, seq_len, bucket_size_mb=buckets[-1],
                        optimizer=o)
              for o in ("sharded", "torch_zero") if profile != "quick"]
    rounds = {"smoke": 2, "quick": 5, "full": 10}[profile]
    return [TrainCase(spec, world, backend, warmup=1 if profile == "smoke" else 2,
                      rounds=rounds) for spec in specs]


@pytest.fixture(scope="module")
def pools():
    cache: dict[tuple[int, str], RankPool] = {}

    def get(world_size: int, backend: str) -> RankPool:
        key = (world_size, backend)
        if key not in cache or not cache[key].alive:
            cache[key] = RankPool(world_size, backend, timeout_s=300)
        return cache[key]

    yield get
    for pool in cache.values():
        pool.close()


@pytest.fixture
def device() -> torch.device:
    """The parent's rounds wait on the ranks, which own the GPUs: it times them on the host
    and never opens a CUDA context of its own."""
    return torch.device("cpu")


def _run_rounds(synced_benchmark, pool: RankPool, fn, *args, warmup: int,
                rounds: int) -> list:
    """Timed rounds of `fn` on all ranks (the shared timing core); their results."""
    results: list = []
    synced_benchmark(lambda: results.append(pool.run(fn, *args)), warmup=warmup,
                     rounds=rounds, precision="fp32")
    extra = synced_benchmark.benchmark.extra_info
    # With gloo the ranks' work runs on the CPU, with nccl on the GPUs. The parent's step
    # returns only once the ranks are done, so its enqueue time is the whole round and says
    # nothing about how much of it was the host's: none is recorded.
    extra.update({keys.TORCH_DEVICE: "cpu" if pool.backend == "gloo" else "cuda",
                  keys.HOST_ENQUEUE_S: None})
    return results[-rounds:]  # with --benchmark-disable it ran once, untimed


@pytest.mark.benchmark(group="allreduce")
def test_allreduce(perf_case: AllReduceCase, synced_benchmark, pools):
    pool = pools(perf_case.world_size, perf_case.backend)
    size = perf_case.size_mb * MB
    per_round = _run_rounds(synced_benchmark, pool, timed_allreduces, size, perf_case.iterations,
                            warmup=1, rounds=perf_case.rounds)
    # Each all-reduce takes as long as its slowest rank; the median over all of them.
    slowest = [max(ranks[r][i] for r in range(perf_case.world_size))
               for ranks in per_round for i in range(perf_case.iterations)]
    seconds = statistics.median(slowest)
    synced_benchmark.benchmark.extra_info.update(
        asdict(perf_case), implementation=f"torch.distributed.all_reduce ({perf_case.backend})",
        dtype="float32", size_bytes=size, allreduce_s_median_max_over_ranks=seconds,
        allreduce_s_min=min(slowest), **bandwidths(size, seconds, perf_case.world_size),
        round_contents=f"{perf_case.iterations} all-reduces + messaging to the ranks",
    )
    assert seconds > 0


def _max_over_ranks(rounds: list[list[dict]], key: str) -> list[float]:
    return [max(rank[key] for rank in ranks) for ranks in rounds]


@pytest.mark.benchmark(group="ddp-train-step")
def test_train_step(perf_case: TrainCase, synced_benchmark, pools):
    spec = perf_case.spec
    pool = pools(perf_case.world_size, perf_case.backend)
    try:
        init = pool.run(setup_train, spec)
        rounds = _run_rounds(synced_benchmark, pool, train_round, warmup=perf_case.warmup,
                             rounds=perf_case.rounds)
        pool.run(teardown_train)
    except RankError as error:
        if not is_out_of_memory(error):
            raise
        pytest.skip(f"out of memory (a property of this workload): {str(error)[:300]}")
    step = statistics.median(_max_over_ranks(rounds, "step_s"))
    sync = statistics.median(_max_over_ranks(rounds, "sync_s"))
    last = rounds[-1]
    info = {
        **asdict(spec), "world_size": perf_case.world_size, "backend": perf_case.backend,
        "precision": "fp32", "implementation": spec.variant,
        "step_s_median_max_over_ranks": step, "step_s_per_round": _max_over_ranks(rounds,
                                                                                 "step_s"),
        # Time from the end of backward until every gradient is synchronised: the
        # communication left exposed (torch DDP waits inside backward, so ~0 there).
        "sync_wait_s": sync, "sync_wait_fraction": sync / step,
        "memory_after_init_bytes": max(r["memory_after_init"] or 0 for r in init) or None,
        "peak_memory_bytes": max(r["peak_memory"] or 0 for r in last) or None,
        "memory_before_step_bytes": max(r["memory_before_step"] or 0 for r in last) or None,
        "memory_after_step_bytes": max(r["memory_after_step"] or 0 for r in last) or None,
        "optimizer_state_bytes_per_rank": [r["optimizer_state_bytes"] for r in last],
    }
    synced_benchmark.benchmark.extra_info.update(info)
    assert step > 0
    assert all(r["optimizer_state_bytes"] > 0 for r in last)


test_allreduce.perf_cases = allreduce_cases
test_train_step.perf_cases = train_cases
