"""The `extra_info` keys the perf suites write, read in this one place.

If a suite renames a key, change it here. A result's kind is decided by which keys it has.
"""

import math

from systems.common.clock import DEVICE, WALL

# End-to-end model steps (tests/perf/test_end_to_end.py).
SIZE = "size"
SEQ_LEN = "seq_len"  # tokens per sequence (attention results: derived from `shape`)
BATCH = "batch_size"
MODE = "mode"
PRECISION = "precision"
COMPILED = "compiled"
ATTENTION = "attention"
MFU = "mfu"
PEAK_MEMORY = "peak_memory_bytes"

# Training recipes (tests/perf/test_training_recipes.py): end-to-end steps plus the recipe
# name and the first step's seconds (compilation included).
RECIPE = "recipe"
COLD_START_S = "cold_start_s"
# Where the checkpointing rule measured the step (`systems.bench.checkpoint_fit`), the peak
# it predicted for the step, beside the measured PEAK_MEMORY.
PREDICTED_PEAK_MEMORY = "predicted_peak_memory_bytes"

# Attention microbenchmarks (tests/perf/test_attention.py): q/k/v `shape` (..., seq, d) and
# the pass in `mode`; `normalise` derives the sequence length, head dim and batch x heads.
IMPLEMENTATION = "implementation"
SHAPE = "shape"
DTYPE = "dtype"
CAUSAL = "causal"
PASS = MODE
HEAD_DIM = "head_dim"
BATCH_HEADS = "batch_heads"
# Our eager batch-1 cases also hold {implementation: median seconds} of rounds taken in turn
# with the SDPA backends in the same run (`systems.bench.timing.interleaved_rounds`).
INTERLEAVED_MEDIANS_S = "interleaved_medians_s"
INTERLEAVED_ROUNDS = "interleaved_rounds"

# Distributed training and collectives (tests/perf/test_distributed.py).
# Their step and collective times are CUDA-event medians of the slowest rank, recorded in
# extra_info; the pytest-benchmark round also holds messaging to the rank processes.
VARIANT = "variant"
OPTIMIZER = "optimizer"
BUCKET_SIZE_MB = "bucket_size_mb"
WORLD_SIZE = "world_size"
BACKEND = "backend"
SIZE_BYTES = "size_bytes"
ALGBW = "algbw_gbps"
BUSBW = "busbw_gbps"
STEP_S = "step_s_median_max_over_ranks"
BATCH_PER_RANK = "batch_per_rank"
# Saved by runs before the report derived it from the same run's "none" case.
OVERHEAD_VS_NO_COMM = "overhead_vs_no_comm"
SYNC_WAIT_FRACTION = "sync_wait_fraction"

# Every timed case: the host's time until step() returned, median over rounds (seconds),
# and the torch device its work ran on ("cpu": every round is the host's own work).
HOST_ENQUEUE_S = "host_enqueue_s_median"
TORCH_DEVICE = "device"
# Every timed GPU case also: each timed round's host time until step() returned, and the
# device clock (`systems.bench.timing.device_busy_rounds`): the device's busy time (kernels,
# copies, memsets) of each profiled round, seconds. A pooled baseline also keeps each run's
# median of both (systems.runs.baseline).
HOST_ENQUEUE_ROUNDS_S = "host_enqueue_s"
HOST_ENQUEUE_RUN_MEDIANS = "host_enqueue_run_medians_s"
DEVICE_KERNEL_S = "device_busy_s"
DEVICE_KERNEL_RUN_MEDIANS = "device_busy_run_medians_s"
# Test-only switches (systems.bench.timing): the fraction of host time or of device work
# added to each round; a run holding either stands for no code's speed.
INJECTED_HOST = "injected_slowdown"
INJECTED_DEVICE = "injected_device_work"

# Written by systems.runs.combine when runs are combined into one file.
SOURCE_RUN = "source_run"
WARMUP_ROUNDS = "warmup_rounds"
# The warm-up study times end-to-end steps too; it is told apart by its test's name.
WARMUP_STUDY_TEST = "test_warmup_study"

# Long attention cases (many matrices, 65536 tokens) also record triton.testing.do_bench's
# median, mean and IQR of its calls (device time), ms; a pooled baseline keeps each run's
# median too and the largest run's IQR (systems.runs.baseline). The gate judges it as a
# device clock.
DO_BENCH_MEDIAN_MS = "do_bench_median_ms"
DO_BENCH_MEAN_MS = "do_bench_mean_ms"
DO_BENCH_IQR_MS = "do_bench_iqr_ms"
DO_BENCH_RUN_MEDIANS_MS = "do_bench_run_medians_ms"
DO_BENCH_TIMING = "do_bench_timing"  # which clock: "device" (systems.bench.timing)
# Ours there also holds {implementation: [do_bench median of each round, ms]} of rounds taken
# in turn with the SDPA backends (`systems.bench.timing.interleaved_device_time`); round i of
# every list was timed together. A pooled baseline holds every run's rounds, run after run.
INTERLEAVED_DEVICE_MS = "interleaved_device_ms"
# The kernels FlashAttentionTriton's dispatch ran ("forward+backward", systems.attention.dispatch).
KERNELS = "kernels"
# A recipe whose whole step is replayed from one CUDA graph.
CUDA_GRAPH = "cuda_graph"
TIMING = "timing"  # "wall" or "device": which clock the rounds read (systems.bench.timing)
RUN_MEDIANS = "run_medians"  # a pooled baseline's median of each run (systems.runs.gate)
# In a run's machine_info: the host speed probe (systems.common.host_speed), measured once
# per session, and in a pooled baseline each run's value (systems.runs.baseline).
HOST_PYTHON_LOOP_MS = "host_python_loop_ms"
HOST_PYTHON_LOOP_MS_RUNS = f"{HOST_PYTHON_LOOP_MS}_runs"

# What a benchmark's time measures. Below about 1 ms an eager call is host-bound, and the
# two kinds differ by 2-3x: never compare one with the other.
EAGER_TIME = "eager end-to-end (host included)"
REPLAY_TIME = "device time (CUDA-graph replay)"
DO_BENCH_TIME = "device time (do_bench)"
IN_TURN_TIME = "device time (do_bench rounds taken in turn)"
RANK_EVENT_TIME = "eager, CUDA events per step, median of the slowest rank"

# Keys runs saved before the suites spoke one vocabulary, and the key each now is.
RETIRED_KEYS = {"context_length": SEQ_LEN, "context": SEQ_LEN, "model": SIZE,
                "bucket_mb": BUCKET_SIZE_MB}


# Values runs saved before an implementation's names became one, and the name each now is.
RETIRED_NAMES = {ATTENTION: {"flash_triton": "triton"}}


def normalise(info: dict) -> dict:
    """extra_info with the derived keys the report reads (the original keys are kept),
    retired keys included under their current names and retired names as the current."""
    info = {**{new: info[old] for old, new in RETIRED_KEYS.items()
               if old in info and new not in info}, **info}
    info |= {key: names[info[key]] for key, names in RETIRED_NAMES.items()
             if info.get(key) in names}
    shape = info.get(SHAPE)
    if IMPLEMENTATION not in info or not isinstance(shape, list) or len(shape) < 2:
        return info
    return {SEQ_LEN: shape[-2], HEAD_DIM: shape[-1], BATCH_HEADS: math.prod(shape[:-2]), **info}


def kind(info: dict, name: str = "") -> str:
    """'end_to_end', 'recipe', 'warmup_study', 'attention', 'collective', 'ddp' or 'other'."""
    if name.startswith(WARMUP_STUDY_TEST):
        return "warmup_study"
    if SIZE_BYTES in info and (ALGBW in info or BUSBW in info):
        return "collective"
    if VARIANT in info:
        return "ddp"
    if IMPLEMENTATION in info:
        return "attention"
    if RECIPE in info:
        return "recipe"
    if MODE in info and SIZE in info:
        return "end_to_end"
    return "other"


def time_kind(info: dict, name: str = "") -> str:
    """What the pytest-benchmark round time (or, for distributed cases, the extra_info step
    and collective times) of this benchmark measures."""
    if kind(info, name) in ("ddp", "collective"):
        return RANK_EVENT_TIME
    recorded = info.get(TIMING)  # runs saved since the timing core record it; older ones
    if recorded in (WALL, DEVICE):  # are told apart by their mode and options below
        return REPLAY_TIME if recorded == DEVICE else EAGER_TIME
    if "graph replay" in str(info.get(MODE, "")) or info.get(CUDA_GRAPH) is True:
        return REPLAY_TIME
    return EAGER_TIME


def gb_per_s(value: float | None) -> float | None:
    """A bandwidth in GB/s; suites may record GB/s or bytes/s (no link moves 1e5 GB/s)."""
    if value is None:
        return None
    return value / 1e9 if value > 1e5 else value
