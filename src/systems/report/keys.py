"""The `extra_info` keys the perf suites write, read in this one place.

If a suite renames a key, change it here. A result's kind is decided by which keys it has.
"""

# End-to-end model steps (tests/perf/test_end_to_end.py).
SIZE = "size"
CONTEXT = "context_length"
BATCH = "batch_size"
MODE = "mode"
PRECISION = "precision"
COMPILED = "compiled"
ATTENTION = "attention"
TFLOPS = "tflops"
MFU = "mfu"
TOKENS_PER_S = "tokens_per_s"
PEAK_MEMORY = "peak_memory_bytes"

# Attention microbenchmarks (tests/perf/test_attention.py).
IMPLEMENTATION = "implementation"
SEQ_LEN = "seq_len"
HEAD_DIM = "head_dim"
DTYPE = "dtype"
PASS = "pass"

# Distributed training and collectives (tests/perf/test_distributed.py).
VARIANT = "variant"
BUCKET_MB = "bucket_size_mb"
WORLD_SIZE = "world_size"
BACKEND = "backend"
SIZE_BYTES = "size_bytes"
ALGBW = "algbw"
BUSBW = "busbw"
COMM_FRACTION = "comm_fraction"

# Written by systems.bench.history when runs are combined into one file.
SOURCE_RUN = "source_run"
WARMUP_ROUNDS = "warmup_rounds"
# The warm-up study times end-to-end steps too; it is told apart by its test's name.
WARMUP_STUDY_TEST = "test_warmup_study"

# Short column headers for keys shown in tables.
HEADERS = {SIZE: "size", CONTEXT: "ctx", MODE: "mode", PRECISION: "precision",
           COMPILED: "compiled", PASS: "pass", DTYPE: "dtype", SEQ_LEN: "seq len",
           HEAD_DIM: "head dim", IMPLEMENTATION: "implementation", ATTENTION: "attention"}


def kind(info: dict, name: str = "") -> str:
    """'end_to_end', 'warmup_study', 'attention', 'collective', 'ddp' or 'other'."""
    if name.startswith(WARMUP_STUDY_TEST):
        return "warmup_study"
    if IMPLEMENTATION in info and SEQ_LEN in info:
        return "attention"
    if SIZE_BYTES in info and (ALGBW in info or BUSBW in info):
        return "collective"
    if VARIANT in info:
        return "ddp"
    if MODE in info and SIZE in info:
        return "end_to_end"
    return "other"


def gb_per_s(value: float | None) -> float | None:
    """A bandwidth in GB/s; suites may record GB/s or bytes/s (no link moves 1e5 GB/s)."""
    if value is None:
        return None
    return value / 1e9 if value > 1e5 else value
