#!/usr/bin/env bash
# Distributed correctness (NCCL) and perf on a multi-GPU machine.
#   phase 1: NCCL correctness tests on all GPUs, then perf at world size 2 (GPUs 0,1)
#   phase 2: perf re-run at world size 2 (see below), then 4 and 8 GPUs where present
# Usage: scripts/distributed_gpu_run.sh 1|2 [OUTDIR]
# Results: OUTDIR/bench (pytest-benchmark autosave) and OUTDIR/phase*.log (default OUTDIR: out).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
phase=${1:?usage: $0 1|2 [OUTDIR]}
out=${2:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$out/phase$phase.log"
bench=(--benchmark-storage="file://$out/bench" --benchmark-autosave --perf-profile quick)
if [ "$phase" = 1 ]; then
    python3 -m pytest tests/distributed -q -k nccl -p no:cacheprovider 2>&1 \
        | tee -a "$out/phase1.log"
    CUDA_VISIBLE_DEVICES=0,1 python3 -m pytest tests/perf/test_distributed.py -q \
        -p no:cacheprovider -k "train_step or nccl" "${bench[@]}" 2>&1 | tee -a "$out/phase1.log"
else  # re-run of the cases whose memory phase 1 measured with earlier models still alive
    CUDA_VISIBLE_DEVICES=0,1 python3 -m pytest tests/perf/test_distributed.py -q \
        -p no:cacheprovider -k "train_step and (none or bucketed or fsdp)" "${bench[@]}" \
        2>&1 | tee -a "$out/phase2.log"
    # Scaling: the same subset on 4, then 8 GPUs where the machine has them; the NCCL
    # all-reduce at every world size above 2 runs with the largest.
    gpus=$(nvidia-smi --list-gpus | wc -l)
    for n in 4 8; do
        (( n <= gpus )) || continue
        select="train_step and (none or torch_ddp or bucketed-1MB or bucketed-1000MB or fsdp)"
        (( n == gpus )) && select="(nccl and not world2) or ($select)"
        CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) python3 -m pytest \
            tests/perf/test_distributed.py -q -p no:cacheprovider -k "$select" \
            "${bench[@]}" 2>&1 | tee -a "$out/phase2.log"
    done
fi
