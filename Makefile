# Two commands do everything on a fresh Linux machine with Python 3.11+:
#   make bench   the perf suite on the local GPU (CPU smoke profile without one), compared
#                with this GPU's baseline by a noise-aware gate
#   make test    correctness and distributed tests
# Keeping results (docs/benchmarking.md):
#   make baseline            record the quick profile as this GPU's baseline (commit it)
#   make study NAME=x PERF_ARGS='-k ...'   save a study under .benchmarks/<GPU>/studies/
# On one GPU, in shards of at most 8 minutes, resumable (run again: passed shards are kept):
#   make gpu-test            every GPU-marked correctness test
#   make gpu-baseline        the baseline (three runs pooled) and the gate's demonstrations
#   SHARD_ARGS='--deadline-s 540' starts no shard that would end after 9 minutes
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROFILE ?=
PERF_ARGS ?=
PROFILE_FLAG := $(if $(PROFILE),--perf-profile=$(PROFILE),)
NAME ?=
SHARD_ARGS ?=
BASELINE_RUNS ?= 3
COLUMNS := --benchmark-columns=median,iqr,mean,stddev,rounds

.PHONY: bench baseline study test smoke lint report docs clean gpu-test gpu-baseline

# A Python that already has a CUDA torch (e.g. a GPU image) is reused through
# --system-site-packages; otherwise torch 2.13.0 is installed first (pinned, because a bare
# `torch` requirement would pull whatever is newest).
$(STAMP): pyproject.toml
	@if $(PYTHON) -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; \
	then $(PYTHON) -m venv --system-site-packages $(VENV); \
	else $(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e ".[test,dev]"
	@touch $(STAMP)

bench: $(STAMP)
	$(BIN)/pytest tests/perf $(PROFILE_FLAG) --benchmark-autosave --benchmark-compare \
		--perf-gate $(COLUMNS) $(PERF_ARGS)

# The complete quick profile (of tests/perf on one GPU, of the distributed suite on several), kept as .benchmarks/<GPU>/baseline_<N>gpu.json only if every
# test passes; refused for subsets (-k, -m, other paths) and other profiles.
# BASELINE_RUNS complete runs are pooled into it: the gate reads each case's drift between them.
baseline: $(STAMP)
	$(BIN)/pytest $$($(BIN)/python -m systems.runs.baseline suite) --perf-profile=quick \
		--perf-baseline $(COLUMNS) $(PERF_ARGS)
	for run in $$(seq 2 $(BASELINE_RUNS)); do \
		$(BIN)/pytest $$($(BIN)/python -m systems.runs.baseline suite) --perf-profile=quick \
			--perf-baseline --perf-baseline-repeat $(COLUMNS) $(PERF_ARGS) || exit 1; done

study: $(STAMP)
	@test -n "$(NAME)" || { echo "usage: make study NAME=<name> [PROFILE=full] [PERF_ARGS='-k ...']"; exit 2; }
	$(BIN)/pytest tests/perf $(PROFILE_FLAG) --perf-study=$(NAME) $(COLUMNS) $(PERF_ARGS)

gpu-test: $(STAMP)
	$(BIN)/python -m systems.runs.shards gpu-test $(SHARD_ARGS)

gpu-baseline: $(STAMP)
	$(BIN)/python -m systems.runs.shards gpu-baseline $(SHARD_ARGS)

test: $(STAMP)
	$(BIN)/pytest tests/correctness tests/distributed -n auto --timeout=900

# Every perf case once, untimed: proves the perf suite runs (used by CI).
smoke: $(STAMP)
	$(BIN)/pytest tests/perf --perf-profile=smoke --benchmark-disable --timeout=900

# Every generated doc: docs/RESULTS.md and docs/img/*.png from every committed history
# under .benchmarks/, then the generated blocks of README.md, docs/ and the studies (a clean
# tree stays clean when the committed docs are current). `make report` is the same.
report docs: $(STAMP)
	$(BIN)/python -m tools.docgen --results

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV)
