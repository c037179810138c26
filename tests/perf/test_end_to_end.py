"""End-to-end Transformer LM steps: size x context x mode x precision x compile.

Profiles: `smoke` (tiny model on CPU), `quick` (every axis at least once, ~8 min on one
H100), `full` (the whole matrix; select parts with -k, e.g. -k "2.7b and train_step").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from systems.bench.workloads import MODES, build_model_workload
from systems.model import get_config

SIZES = ("small", "medium", "large", "xl", "2.7b")
CONTEXTS = (128, 256, 512, 1024)
PRECISIONS = ("fp32", "bf16")
WARMUP_STUDY = (0, 1, 2, 5)


@dataclass(frozen=True)
class StepCase:
    size: str
    context: int
    mode: str
    precision: str
    compiled: bool
    warmup: int = 2
    rounds: int = 5
    batch: int = 4

    @property
    def id(self) -> str:
        compile_tag = "compiled" if self.compiled else "eager"
        return f"{self.size}-ctx{self.context}-{self.mode}-{self.precision}-{compile_tag}"


def _rounds(size: str) -> int:
    return 10 if size in ("tiny", "small", "medium") else 5


def _case(size: str, context: int, mode: str, precision: str, compiled: bool) -> StepCase:
    # Compilation happens in warm-up; compiled graphs need a few more rounds to settle.
    return StepCase(size, context, mode, precision, compiled,
                    warmup=3 if compiled else 2, rounds=_rounds(size))


def perf_cases(profile: str) -> list[StepCase]:
    if profile == "smoke":
        cases = [_case("tiny", 64, mode, precision, False)
                 for mode, precision in itertools.product(MODES, PRECISIONS)]
        cases.append(_case("tiny", 64, "train_step", "fp32", True))
        return [StepCase(**{**c.__dict__, "rounds": 3, "warmup": 1 + c.compiled}) for c in cases]
    if profile == "full":
        return [_case(*combo) for combo in
                itertools.product(SIZES, CONTEXTS, MODES, PRECISIONS, (False, True))]
    return [
        *(_case(size, 512, "train_step", "bf16", False) for size in SIZES),
        _case("2.7b", 512, "train_step", "fp32", False),
        *(_case("small", ctx, "train_step", "bf16", False) for ctx in (128, 256, 1024)),
        *(_case("small", 512, mode, precision, False)
          for mode, precision in itertools.product(("forward", "forward_backward"), PRECISIONS)),
        _case("small", 512, "train_step", "fp32", False),
        _case("small", 512, "forward", "bf16", True),
        _case("small", 512, "train_step", "bf16", True),
    ]


def run_step_case(case: StepCase, device, synced_benchmark, *, warmup: int, group: str) -> None:
    workload = build_model_workload(
        get_config(case.size), batch_size=case.batch, context_length=case.context,
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
    size, context = ("tiny", 64) if profile == "smoke" else ("small", 512)
    step = StepCase(size, context, "train_step", "bf16", False, rounds=5)
    return [WarmupCase(w, step) for w in WARMUP_STUDY]


def test_warmup_study(perf_case: WarmupCase, device, synced_benchmark) -> None:
    """Same step with 0/1/2/5 untimed warm-up steps: what skipping warm-up does to the mean."""
    run_step_case(perf_case.step, device, synced_benchmark, warmup=perf_case.warmup,
                  group=f"warmup-study-{perf_case.step.size}")


test_warmup_study.perf_cases = warmup_cases  # read by pytest_generate_tests in conftest.py
