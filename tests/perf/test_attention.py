"""Attention benchmarks: implementations x sequence x head dim x dtype x pass.

Four studies:
- `test_attention`: batch 1, one head, causal (plus the leaderboard's 16 x 16384 x 64, one
  pass at a time); forward, backward and forward+backward timed separately for every
  implementation (SDPA's flash and cuDNN backends, compiled flex_attention, the PyTorch
  reference eager and compiled, the tiled PyTorch FlashAttention-2, and the Triton kernels
  with a compiled PyTorch backward or their own). Ours at batch 1 (forward+backward, CUDA)
  also records medians of rounds taken in turn with SDPA's flash and cuDNN backends in
  `extra_info["interleaved_medians_s"]`: the same-run eager comparison. Cases of many
  matrices (16 x 16384) also record do_bench's device time, as the leaderboard case does,
  and ours there do_bench rounds taken in turn with the two SDPA backends
  (`extra_info["interleaved_device_ms"]`): the same-run device-time comparison.
  The full profile adds every handout shape (seq 128..65536, d 16..128) in fp32 and bf16
  for every implementation, and ours in fp16 with its rounds taken in turn.
- `test_attention_handout_sweep`: batch 8, no heads, not causal, fp32, d 16..128 and
  seq 256..16384: forward and backward timed, memory in use before backward recorded.
- `test_attention_leaderboard`: q, k, v of shape (16, 16384, 64), bf16, causal, forward +
  o.sum().backward() through `torch.compile(FlashAttentionTriton.apply)`, with SDPA and
  flex_attention on the same shape; the device time of `triton.testing.do_bench` (median
  and mean, through `systems.bench.timing.device_time`) goes into extra_info beside
  pytest-benchmark's own numbers, with ours in do_bench rounds taken in turn as above.
- `test_attention_table` (full profile): shapes from one 16k sequence to many short
  ones (batch x heads 16 to 128, seq 1024 to 16384, d 64 and 128) and the 2.7b model's
  heads (4 x 32 x 512 and 2048, d = 80), bf16, causal, forward+backward of ours (the
  dispatch's pick, recorded in `extra_info["kernels"]`), with short do_bench rounds taken
  in turn with SDPA's cuDNN and flash backends and FlashAttention-4 where `flash-attn-4` is
  installed (`extra_info["interleaved_device_ms"]`).
- `test_attention_device_time`: the batch-1 forward + backward of the rivals (SDPA flash and
  cuDNN, compiled flex_attention, the Triton kernels) captured in a CUDA graph and timed by
  replay. Up to seq 8192 the eager rounds above time the host queuing kernels; replay
  leaves only the GPU's work, so the kernels themselves are compared.

Every case records the first call's time (compilation and JIT included) as
`cold_start_s`. Profiles: `smoke` (CPU-sized); `quick`, the regression baseline (a few
minutes on one H100): eager bf16 forward+backward at batch 1, seq 1024..65536, d 64 and
128, ours against SDPA flash, SDPA cuDNN and compiled flex_attention; 16 x 16384 x 128 and
the leaderboard (16 x 16384 x 64) for ours, with our default backward and the fused Gluon
one (ordered and not), against the two SDPA backends, each also timed by do_bench; and
graph replay at seq 1024 and 16384; `full` (every study, the table's shapes, and the Gluon
backwards in graph replay at d = 64 and 128 too; select with -k).

Implementations are looked up by name in `systems.attention.registry`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import torch

from systems.attention.dispatch import kernels_for
from systems.bench.attention import (
    ATTENTION_MODES,
    AttentionWorkload,
    UnsupportedWorkload,
    build_attention_workload,
)
from systems.bench.metrics import is_out_of_memory, out_of_memory_reason
from systems.bench.timing import interleaved_device_time, interleaved_rounds
from systems.model.cuda_graph import CapturedStep
from systems.runs import keys

SWEEP_IMPLEMENTATIONS = ("reference", "reference_compiled", "sdpa_flash", "sdpa_cudnn",
                         "flex_compiled", "flash_pytorch", "triton_compiled_bwd", "triton")
SWEEP_SEQS = tuple(2**p for p in range(7, 17))
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Ours and its rivals in the quick profile's eager sweep.
RIVALS = ("sdpa_flash", "sdpa_cudnn", "flex_compiled", "triton")
QUICK_SEQS = (1024, 4096, 16384, 65536)
# Whether ours keeps up with SDPA in what an eager caller sees is a comparison of host-bound
# times on a host whose speed drifts: separate cases' medians come from different moments.
# So our eager batch-1 cases on CUDA also take rounds in turn with these rivals.
INTERLEAVED_RIVALS = ("sdpa_flash", "sdpa_cudnn")
INTERLEAVED_ROUNDS = 30
# At 16 x 16384 (the leaderboard's size) flex_attention is far behind: the fused SDPA
# backends are the rivals there.
LEADERBOARD_RIVALS = ("triton", "sdpa_cudnn", "sdpa_flash")
# Ours with the fused Gluon backward (sm_90 only), ordered (deterministic) and not: beside
# our default at the leaderboard's size and d = 128 (and, in the full profile, replayed).
GLUON_BACKWARDS = ("triton_gluon_bwd", "triton_gluon_bwd_unordered")
# do_bench's warm-up and timed spans (ms) wherever a case records device time beside its
# rounds: at 4 to 8 ms a call, half a second's span holds well over fifty calls.
DO_BENCH_SPANS_MS = {"warmup_ms": 100, "rep_ms": 500}
# Ours and a rival a few hundredths apart differ by less than the GPU's drift between two
# cases timed minutes apart (up to a tenth at 16 x 16384): where a case records device
# time, ours also takes do_bench rounds in turn with the SDPA backends, each round short.
DEVICE_ROUNDS = 5
DEVICE_ROUND_SPANS_MS = {"warmup_ms": 10, "rep_ms": 100}


@dataclass(frozen=True)
class AttentionCase:
    impl: str
    shape: tuple[int, ...]
    dtype: str
    mode: str
    is_causal: bool
    warmup: int = 3
    rounds: int = 10

    @property
    def id(self) -> str:
        shape = "x".join(map(str, self.shape))
        mask = "causal" if self.is_causal else "full"
        return f"{self.impl}-{shape}-{self.dtype}-{mask}-{self.mode}"

    @property
    def group(self) -> str:
        return f"{'x'.join(map(str, self.shape))}-{self.dtype}-{self.mode}"


def _sweep_case(impl: str, seq: int, d: int, dtype: str, mode: str) -> AttentionCase:
    return AttentionCase(impl, (1, 1, seq, d), dtype, mode, is_causal=True)


def perf_cases(profile: str) -> list[AttentionCase]:
    if profile == "smoke":
        cheap = ("reference", "sdpa_flash", "flex_compiled", "flash_pytorch",
                 "triton_compiled_bwd", "triton")
        cases = [_sweep_case(impl, 128, 16, "fp32", "forward_backward") for impl in cheap]
        cases += [_sweep_case("triton", 128, 16, "fp16", mode) for mode in ("forward", "backward")]
        return [AttentionCase(**{**c.__dict__, "warmup": 1, "rounds": 2}) for c in cases]
    # Quick: ours against the rivals, eager forward+backward at batch 1 (host-bound up to a
    # few thousand tokens), and at the leaderboard's 16 heads with d = 128 (d = 64 is the
    # leaderboard test's).
    sweep = [_sweep_case(impl, seq, d, "bf16", "forward_backward")
             for d, seq, impl in itertools.product((64, 128), QUICK_SEQS, RIVALS)]
    wide = [AttentionCase(impl, (16, 1, 16384, 128), "bf16", "forward_backward", is_causal=True)
            for impl in (*LEADERBOARD_RIVALS, *GLUON_BACKWARDS)]
    if profile == "quick":
        return sweep + wide
    every_seq = [_sweep_case(*combo) for combo in itertools.product(
        SWEEP_IMPLEMENTATIONS, SWEEP_SEQS, HEAD_DIMS, ("fp32", "bf16"), ATTENTION_MODES)]
    # The handout's eager grid in fp16 too, ours only: its rounds taken in turn time the
    # SDPA backends beside it, so ours / SDPA is known at every handout shape and dtype.
    fp16_eager = [_sweep_case("triton", seq, d, "fp16", "forward_backward")
                  for seq, d in itertools.product(SWEEP_SEQS, HEAD_DIMS)]
    # The leaderboard's shape one pass at a time: where the rivals gain or lose.
    leaderboard_passes = [AttentionCase(impl, (16, 1, 16384, 64), "bf16", mode, is_causal=True)
                          for impl, mode in itertools.product(RIVALS, ("forward", "backward"))]
    cases = sweep + wide + every_seq + fp16_eager + leaderboard_passes
    return list({case.id: case for case in cases}.values())


def _attention_workload(case: AttentionCase, device: torch.device) -> AttentionWorkload:
    return build_attention_workload(case.impl, shape=case.shape, dtype=DTYPES[case.dtype],
                                    mode=case.mode, is_causal=case.is_causal, device=device)


def build_case_workload(case: AttentionCase, device: torch.device) -> AttentionWorkload:
    """The case's workload; an unsupported one or one that runs out of memory is a skip."""
    try:
        return _attention_workload(case, device)
    except UnsupportedWorkload as reason:
        pytest.skip(f"unsupported: {reason}")
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        pytest.skip(out_of_memory_reason(error))


def run_attention_case(case: AttentionCase, device: torch.device, synced_benchmark) -> None:
    """Build, time the first call (compilation included), then benchmark the case."""
    synced_benchmark.benchmark.group = case.group
    workload = build_case_workload(case, device)
    synced_benchmark(
        workload.step, warmup=case.warmup, rounds=case.rounds,
        precision=case.dtype, flops=workload.flops, info=workload.info, cold_start=True,
    )
    if _records_device_time(case, device) and not synced_benchmark.benchmark.disabled:
        synced_benchmark.record_device_time(workload.step, **DO_BENCH_SPANS_MS)
        if _is_ours(case.impl) and _many_matrices(case):
            record_device_time_in_turn(synced_benchmark, case.impl, workload.step,
                                       _rival_steps(case, device))
    if _interleaves(case, device) and not synced_benchmark.benchmark.disabled:
        synced_benchmark.benchmark.extra_info.update(
            {keys.INTERLEAVED_MEDIANS_S: _interleaved_medians(case, device, workload),
             keys.INTERLEAVED_ROUNDS: INTERLEAVED_ROUNDS})


def _records_device_time(case: AttentionCase, device: torch.device) -> bool:
    # Problems of many matrices (16 x 16384) are where the kernels are compared, and calls
    # of several milliseconds (one 65536-token matrix) heat the GPU: eager rounds there
    # move with clocks and allocator state between runs, do_bench's median less.
    return device.type == "cuda" and (_many_matrices(case) or case.shape[-2] >= 65536)


def _many_matrices(case: AttentionCase) -> bool:
    return case.shape[0] * case.shape[1] > 1


def _interleaves(case: AttentionCase, device: torch.device) -> bool:
    return (device.type == "cuda" and case.impl == "triton" and case.mode == "forward_backward"
            and case.shape[:-2] == (1, 1))


def _is_ours(impl: str) -> bool:
    return impl.startswith("triton")


def _rival_steps(case: AttentionCase, device: torch.device,
                 rivals: tuple[str, ...] = INTERLEAVED_RIVALS) -> dict[str, Callable[[], object]]:
    """The case's step for each of `rivals` that runs it."""
    return _steps_that_run(
        lambda rival: _attention_workload(replace(case, impl=rival), device).step, rivals)


def _steps_that_run(build: Callable[[str], Callable[[], object]],
                    rivals: tuple[str, ...] = INTERLEAVED_RIVALS
                    ) -> dict[str, Callable[[], object]]:
    """build(rival) for each of `rivals`, less those it finds unsupported here."""
    steps = {}
    for rival in rivals:
        try:
            steps[rival] = build(rival)
        except UnsupportedWorkload:
            continue
    return steps


def _interleaved_medians(case: AttentionCase, device: torch.device,
                         ours: AttentionWorkload) -> dict[str, float]:
    """Median seconds of ours and each rival that runs this case, rounds taken in turn."""
    stats = interleaved_rounds({case.impl: ours.step, **_rival_steps(case, device)},
                               warmup=case.warmup, rounds=INTERLEAVED_ROUNDS, device=device)
    return {name: timing.median for name, timing in stats.items()}


def record_device_time_in_turn(synced_benchmark, impl: str, step: Callable[[], object],
                               rival_steps: dict[str, Callable[[], object]],
                               rounds: int = DEVICE_ROUNDS,
                               spans_ms: dict[str, int] = DEVICE_ROUND_SPANS_MS) -> None:
    """Ours and the rivals' device time in `rounds` do_bench rounds taken in turn: each
    one's median per round, in ms, into extra_info; a ratio is then read round by round."""
    medians = interleaved_device_time({impl: step, **rival_steps}, rounds=rounds,
                                      **spans_ms)
    synced_benchmark.benchmark.extra_info[keys.INTERLEAVED_DEVICE_MS] = {
        name: [seconds * 1e3 for seconds in per_round] for name, per_round in medians.items()}


def test_attention(perf_case: AttentionCase, device, synced_benchmark) -> None:
    run_attention_case(perf_case, device, synced_benchmark)


def handout_cases(profile: str) -> list[AttentionCase]:
    def case(impl: str, seq: int, d: int, mode: str) -> AttentionCase:
        return AttentionCase(impl, (8, seq, d), "fp32", mode, is_causal=False)

    modes = ("forward", "backward")
    if profile == "smoke":
        return [AttentionCase(**{**case(impl, 256, 16, mode).__dict__, "warmup": 1,
                                 "rounds": 2})
                for impl, mode in itertools.product(("reference", "triton"), modes)]
    if profile != "full":
        return []
    impls = ("reference", "reference_compiled", "triton")
    seqs = (256, 1024, 4096, 8192, 16384)
    return [case(impl, seq, d, mode)
            for impl, seq, d, mode in itertools.product(impls, seqs, HEAD_DIMS, modes)]


def test_attention_handout_sweep(perf_case: AttentionCase, device, synced_benchmark) -> None:
    run_attention_case(perf_case, device, synced_benchmark)


test_attention_handout_sweep.perf_cases = handout_cases


LEADERBOARD_IMPLEMENTATIONS = ("triton_compiled", *LEADERBOARD_RIVALS, *GLUON_BACKWARDS,
                               "flex_compiled")


def leaderboard_shape(impl: str) -> tuple[int, ...]:
    # SDPA's fused backends and flex_attention want (batch, heads, seq, d).
    return (16, 16384, 64) if _is_ours(impl) else (16, 1, 16384, 64)


def leaderboard_cases(profile: str) -> list[AttentionCase]:
    def case(impl: str) -> AttentionCase:
        return AttentionCase(impl, leaderboard_shape(impl), "bf16", "leaderboard",
                             is_causal=True, warmup=5, rounds=20)

    if profile == "quick":
        return [case(impl) for impl in (*LEADERBOARD_RIVALS, *GLUON_BACKWARDS)]
    return [case(impl) for impl in LEADERBOARD_IMPLEMENTATIONS]


@pytest.mark.gpu
def test_attention_leaderboard(perf_case: AttentionCase, device, synced_benchmark) -> None:
    """Forward, o.sum(), backward, as the CS336 2025 leaderboard times it."""
    from systems.accounting import attention_flops

    synced_benchmark.benchmark.group = "leaderboard-16x16384x64-bf16-causal"
    try:
        forward_backward = leaderboard_step(perf_case.impl, device)
    except UnsupportedWorkload as reason:
        pytest.skip(f"unsupported: {reason}")
    flops = attention_flops(16, 16384, 16384, 64, True, "forward_backward")
    synced_benchmark(
        forward_backward, warmup=perf_case.warmup, rounds=perf_case.rounds, precision="bf16",
        flops=flops, cold_start=True,
        info={"implementation": perf_case.impl, "shape": list(perf_case.shape),
              "dtype": "bfloat16", "causal": True, "mode": "forward_backward(o.sum())"},
    )
    synced_benchmark.record_device_time(forward_backward, **DO_BENCH_SPANS_MS)
    if _is_ours(perf_case.impl) and not synced_benchmark.benchmark.disabled:
        record_device_time_in_turn(synced_benchmark, perf_case.impl, forward_backward,
                                   _steps_that_run(lambda rival: leaderboard_step(rival, device)))


def leaderboard_step(impl: str, device: torch.device) -> Callable[[], None]:
    """The leaderboard's forward, o.sum(), backward of `impl` on fresh random q, k, v;
    UnsupportedWorkload where it cannot run here."""
    from systems.bench.attention import attention_function

    attend = attention_function(impl, is_causal=True, device=device, dtype=torch.bfloat16,
                                n_q=16384, n_k=16384)
    q, k, v = (torch.randn(leaderboard_shape(impl), device=device, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))

    def forward_backward() -> None:
        attend(q, k, v).sum().backward()

    return forward_backward


test_attention_leaderboard.perf_cases = leaderboard_cases


# Shapes (batch, heads, seq, d) from long single sequences to many short ones, and the 2.7b
# model's heads, where our default is compared with SDPA and, where it is installed,
# FlashAttention-4, in device time. Short rounds keep each case to a few seconds.
TABLE_SHAPES = ((1, 16, 16384, 64), (1, 16, 16384, 128), (4, 16, 4096, 64),
                (4, 16, 4096, 128), (8, 16, 1024, 64), (16, 1, 4096, 64), (16, 1, 2048, 128),
                (4, 32, 512, 80), (4, 32, 2048, 80))
TABLE_ROUNDS = 5
TABLE_ROUND_SPANS_MS = {"warmup_ms": 25, "rep_ms": 100}
TABLE_RIVALS = ("sdpa_cudnn", "sdpa_flash", "fa4")


def table_cases(profile: str) -> list[AttentionCase]:
    if profile == "smoke":
        return []
    return [AttentionCase("triton", shape, "bf16", "forward_backward", is_causal=True,
                          warmup=3, rounds=5) for shape in TABLE_SHAPES]


@pytest.mark.gpu
def test_attention_table(perf_case: AttentionCase, device, synced_benchmark) -> None:
    """Ours as the dispatch runs it against SDPA cuDNN and flash and FlashAttention-4, in
    device time taken in turn (the eager rounds beside them are what a caller sees)."""
    synced_benchmark.benchmark.group = f"{perf_case.group}-table"
    workload = build_case_workload(perf_case, device)
    synced_benchmark(workload.step, warmup=perf_case.warmup, rounds=perf_case.rounds,
                     precision=perf_case.dtype, flops=workload.flops, info=workload.info,
                     cold_start=True)
    if synced_benchmark.benchmark.disabled:
        return
    synced_benchmark.benchmark.extra_info[keys.KERNELS] = kernels_for(
        perf_case.shape, DTYPES[perf_case.dtype], device, perf_case.is_causal).name
    record_device_time_in_turn(synced_benchmark, perf_case.impl, workload.step,
                               _rival_steps(perf_case, device, TABLE_RIVALS),
                               rounds=TABLE_ROUNDS,
                               spans_ms=TABLE_ROUND_SPANS_MS)


test_attention_table.perf_cases = table_cases


def device_time_cases(profile: str) -> list[AttentionCase]:
    if profile == "smoke":
        return []
    if profile == "quick":  # short and long, where eager time is host-bound and is not
        return [_sweep_case(impl, seq, 64, "bf16", "forward_backward")
                for seq, impl in itertools.product((1024, 16384), LEADERBOARD_RIVALS)]
    return [_sweep_case(impl, seq, d, "bf16", "forward_backward")
            for d, seq, impl in itertools.product((64, 128), SWEEP_SEQS[3:],
                                                  RIVALS + GLUON_BACKWARDS)]


@pytest.mark.gpu
def test_attention_device_time(perf_case: AttentionCase, device, synced_benchmark) -> None:
    """Forward + backward replayed from a CUDA graph: GPU time without host queuing."""
    synced_benchmark.benchmark.group = f"{perf_case.group}-graph-replay"
    workload = build_case_workload(perf_case, device)
    eager_grads = workload.step()
    replay = CapturedStep(workload.step, warmup=2)
    for _ in range(3):  # two warm-up calls, then capture and a first replay
        graph_grads = replay()
    # A replay must recompute every gradient: poison the graph's outputs, replay, compare.
    for grad in graph_grads:
        grad.fill_(float("nan"))
    replay()
    for eager, graphed in zip(eager_grads, graph_grads, strict=True):
        torch.testing.assert_close(graphed, eager, atol=2e-2, rtol=2e-2)
    info = {**workload.info, "mode": "forward_backward (CUDA graph replay)"}
    synced_benchmark(replay, warmup=perf_case.warmup, rounds=perf_case.rounds,
                     precision=perf_case.dtype, flops=workload.flops, info=info)


test_attention_device_time.perf_cases = device_time_cases
