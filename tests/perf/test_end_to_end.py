"""End-to-end Transformer LM steps: size x seq len x mode x precision x compile.

Profiles: `smoke` (tiny model on CPU), `quick` (the regression gate's cases: every size,
seq len, mode, precision and eager/compiled at least once, six cases), `full` (the whole
matrix and the warm-up study; select parts with -k, e.g. -k "2.7b and train_step").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from systems.bench.workloads import build_model_workload
from systems.model import get_config
from systems.model.train_step import MODES

SIZES = ("small", "medium", "large", "xl", "2.7b")
SEQ_LENS = (128, 256, 512, 1024)
PRECISIONS = ("fp32", "bf16")
WARMUP_STUDY = (0, 1, 2, 5)


@dataclass(frozen=True)
class StepCase:
    size: str
    seq_len: int
    mode: str
    precision: str
    compiled: bool
    warmup: int = 2
    rounds: int = 5
    batch: int = 4

    @property
    def id(self) -> str:
        compile_tag = "compiled" if self.compiled else "eager"
        return f"{self.size}-ctx{self.seq_len}-{self.mode}-{self.precision}-{compile_tag}"


def _rounds(size: str) -> int:
    # The gate judges these on the device clock (profiled rounds, beside these), which the
    # host's noise does not reach: the wall rounds, still reported, need not outnumber it.
    return 10 if size in ("tiny", "small", "medium") else 6


def _case(size: str, seq_len: int, mode: str, precision: str, compiled: bool) -> StepCase:
    # Compilation happens in warm-up; compiled graphs need a few more rounds to settle.
    return StepCase(size, seq_len, mode, precision, compiled,
                    warmup=3 if compiled else 2, rounds=_rounds(size))


def perf_cases(profile: str) -> list[StepCase]:
    if profile == "smoke":
        cases = [_case("tiny", 64, mode, precision, False)
                 for mode, precision in itertools.product(MODES, PRECISIONS)]
        cases.append(_case("tiny", 64, "train_step", "fp32", True))
        return [StepCase(**{**c.__dict__, "rounds": 3, "warmup": 1 + c.compiled}) for c in cases]
    if profile == "full":
        return [_case(*combo) for combo in
                itertools.product(SIZES, SEQ_LENS, MODES, PRECISIONS, (False, True))]
    # Each value of every axis once, the 2.7b bf16 train step (the staff reference) and one
    # compiled step; nothing here is shorter than a few ms, so host noise stays small.
    return [
        _case("small", 128, "forward", "fp32", False),
        _case("medium", 256, "forward_backward", "fp32", False),
        _case("large", 1024, "forward", "bf16", False),
        _case("xl", 512, "train_step", "bf16", False),
        _case("2.7b", 512, "train_step", "bf16", False),
        _case("small", 512, "train_step", "bf16", True),
    ]


def run_step_case(case: StepCase, device, synced_benchmark, *, warmup: int, group: str) -> None:
    workload = build_model_workload(
        get_config(case.size), batch_size=case.batch, seq_len=case.seq_len,
        mode=case.mode, precision=case.precision, compiled=case.compiled, device=device,
    )
    synced_benchmark.benchmark.group = group
    synced_benchmark(
        workload.step, warmup=warmup, rounds=case.rounds, precision=case.precision,
        flops=workload.flops, tokens=workload.tokens,
        info={"size": case.size, **workload.describe()},
    )


def test_end_to_end(perf_case: StepCase, device, synced_benchmark) -> None:
    run_step_case(perf_case, device, synced_benchmark, warmup=perf_case.warmup,
                  group=f"{perf_case.mode}-{perf_case.size}")


@dataclass(frozen=True)
class WarmupCase:
    warmup: int
    step: StepCase

    @property
    def id(self) -> str:
        return f"warmup{self.warmup}-{self.step.id}"


def warmup_cases(profile: str) -> list[WarmupCase]:
    """A study of the harness, not a regression check: `full` (and `smoke`, to keep it
    running) only."""
    if profile == "quick":
        return []
    size, seq_len = ("tiny", 64) if profile == "smoke" else ("small", 512)
    step = StepCase(size, seq_len, "train_step", "bf16", False, rounds=5)
    return [WarmupCase(w, step) for w in WARMUP_STUDY]


def test_warmup_study(perf_case: WarmupCase, device, synced_benchmark) -> None:
    """Same step with 0/1/2/5 untimed warm-up steps: what skipping warm-up does to the mean."""
    run_step_case(perf_case.step, device, synced_benchmark, warmup=perf_case.warmup,
                  group=f"warmup-study-{perf_case.step.size}")


test_warmup_study.perf_cases = warmup_cases  # read by pytest_generate_tests in conftest.py
