#!/usr/bin/env bash
# Training recipes on one CUDA GPU: correctness of the recipes, then the quick perf profile
# (2.7b and small at ctx 512; eager, pytorch_baseline, optimized).
# Usage: scripts/recipes_gpu_run.sh OUTDIR
# Results: OUTDIR/bench (pytest-benchmark, saved as "training_recipes") and OUTDIR/recipes.log.
set -uo pipefail
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/recipes.log"
export PYTHONUNBUFFERED=1
# A fresh compile cache, so that cold_start_s is a cold compile and not a cache hit.
export TORCHINDUCTOR_CACHE_DIR="$out/inductor_cache" TRITON_CACHE_DIR="$out/triton_cache"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$log"
python3 -m pytest tests/correctness/bench/test_recipes.py tests/correctness/training/test_fused_loss.py \
    tests/correctness/attention/test_flash_attention.py -q -p no:cacheprovider -k \
    "recipe or fused or loss or checkpoint or model_with_flash" 2>&1 | tee -a "$log"
python3 -m pytest tests/perf/test_training_recipes.py -q -p no:cacheprovider \
    --perf-profile quick --benchmark-storage="file://$out/bench" \
    --benchmark-save=training_recipes 2>&1 | tee -a "$log"
rm -rf "$out/inductor_cache" "$out/triton_cache"
