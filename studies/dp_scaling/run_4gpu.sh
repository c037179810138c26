#!/usr/bin/env bash
# Data-parallel scaling on one 4-GPU machine, in one go (about 7 minutes on 4 x H100):
#   A  (in parallel) the study at 2 GPUs on GPUs 0,1  |  NCCL correctness at world size 2 on
#      GPUs 2,3, then the study at 1 GPU on GPU 2
#   B  the study at 4 GPUs
#   C  NCCL correctness at world size 4
#   D  the distributed quick profile recorded as .benchmarks/<GPU>/baseline_4gpu.json (as
#      `make baseline` does, one run)
# Run from the repository root:
#   SYSTEMS_COMMIT=<sha of this tree> OUT=<dir> bash studies/dp_scaling/run_4gpu.sh
# Optional: WHEELS=<dir> (pip installs pytest-benchmark and py-cpuinfo2 from it when
# pytest_benchmark is missing; without it the baseline is skipped), BUDGET_S (default 540:
# no phase starts, and each is cut, so that everything ends by then), RECORD_2GPU=1 (also
# record baseline_2gpu.json on GPUs 0,1 if time is left), DRY_RUN=1 (CPU: gloo, a tiny
# model, two processes where the script would use four, no baseline: checks the plumbing).
# Writes to OUT: world1.json world2.json world4.json (the study, one per world size; commit
# them as studies/dp_scaling/runs/), baseline_4gpu.json (commit it under .benchmarks/<GPU>/),
# logs.tar.gz (every log) and summary.txt (what is printed at the end).
#
# Time per phase, from XL fp32 at per-rank batch 8 x ctx 128 (a step takes about 0.4-0.45 s
# there; a variant's build, broadcast and teardown a few seconds): the study times 12
# variants x 2 rounds x (2 warm-up + 4 timed steps) = 144 steps, about 130 s with the builds,
# per world size (fewer variants at 1 GPU); the NCCL tests take 40-90 s per world size (rank
# pools start by spawning); the quick profile is 8 train cases x 7 steps plus 14 all-reduce
# cases, about 100 s. Phase budgets below are ceilings, not estimates.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${SYSTEMS_COMMIT:?set SYSTEMS_COMMIT to the commit this tree is (recorded in every file)}"
export SYSTEMS_COMMIT PYTHONPATH=src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT to the folder that collects the results}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
DRY_RUN=${DRY_RUN:-0}
logs=$(mktemp -d)
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: > "$summary"
say() { echo "[$SECONDS s] $*" | tee -a "$summary"; }
left() { echo $(( BUDGET_S - SECONDS )); }
# cap SECONDS_WANTED: run a command for at most that long, and never past the budget
cap() { local want=$1; shift; local room; room=$(left)
        (( room < want )) && want=$room
        if (( want < 20 )); then say "skipped (budget spent): $*"; return 124; fi
        timeout --kill-after=10 "$want" "$@"; }

if [ "$DRY_RUN" = 1 ]; then
    study=(--backend gloo --size tiny --batch-size 2 --seq-len 16 --rounds 1 --warmup 1
           --steps 1 --bucket-size-mb 0.05 --allreduce-sizes-mb 1 --allreduce-iterations 2)
    big=3; tests=(-k "gloo and (bucket_steps or prefetch_depth or layouts)")
    export OMP_NUM_THREADS=1
else
    study=(--rounds 2 --warmup 2 --steps 4)
    big=4; tests=(-k nccl)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$summary"
fi
run_study() {  # WORLD BUDGET LOG [study args...]
    local world=$1 want=$2 log=$3; shift 3
    cap "$want" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$world" \
        -m studies.dp_scaling.study --out "$OUT/world$world.json" --commit "$SYSTEMS_COMMIT" \
        --time-limit-s $(( want - 60 > 30 ? want - 60 : 30 )) "${study[@]}" "$@" \
        > "$logs/$log" 2>&1
    say "study at $world GPU(s): exit $? ($log)"
}
correctness() {  # LOG [pytest args...]
    local log=$1; shift
    cap 150 "$PY" -m pytest tests/distributed -q -p no:cacheprovider "${tests[@]}" "$@" \
        > "$logs/$log" 2>&1
    say "NCCL correctness ($log): exit $?: $(tail -n 1 "$logs/$log")"
}

say "A: study at 2 GPUs (0,1) | correctness at world size 2 (2,3), then the study at 1 GPU"
if [ "$DRY_RUN" = 1 ]; then
    run_study 2 200 study_world2.log
    correctness correctness_world2.log
    run_study 1 120 study_world1.log --variants none bucketed bucketed_early_step fsdp
else
    CUDA_VISIBLE_DEVICES=0,1 run_study 2 200 study_world2.log &
    ( CUDA_VISIBLE_DEVICES=2,3 correctness correctness_world2.log
      CUDA_VISIBLE_DEVICES=2 run_study 1 120 study_world1.log \
          --variants none torch_ddp bucketed bucketed_early_step fsdp torch_fsdp2 ) &
    wait
fi

say "B: study at $big GPUs"
run_study "$big" 200 "study_world$big.log"

if [ "$DRY_RUN" != 1 ]; then
    say "C: correctness at world size 4 (the world-2 cases ran in A)"
    correctness correctness_world4.log -k "nccl and 4"
fi

if [ "$DRY_RUN" != 1 ] && ! "$PY" -c "import pytest_benchmark" 2>/dev/null \
        && [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" pytest-benchmark py-cpuinfo2 \
        > "$logs/pip.log" 2>&1
fi
if [ "$DRY_RUN" = 1 ]; then
    say "D: skipped in a dry run (a baseline is recorded on GPUs only)"
elif ! "$PY" -c "import pytest_benchmark" 2>/dev/null; then
    say "D: skipped: no pytest-benchmark (carry its wheel and py-cpuinfo2's; WHEELS=dir)"
else
    gpu=$("$PY" -c "from systems.common.hardware import device_slug; print(device_slug())")
    worlds=(4); [ "${RECORD_2GPU:-0}" = 1 ] && worlds=(4 2)
    for world in "${worlds[@]}"; do
        name="baseline_${world}gpu"
        say "D: the distributed quick profile at $world GPUs as .benchmarks/$gpu/$name.json"
        CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( world - 1 ))) cap 220 "$PY" -m pytest \
            tests/perf/test_distributed.py -p no:cacheprovider --perf-profile=quick \
            --perf-baseline --benchmark-columns=median,iqr,mean,stddev,rounds \
            > "$logs/$name.log" 2>&1
        say "$name: exit $?: $(tail -n 1 "$logs/$name.log")"
        cp ".benchmarks/$gpu/$name.json" "$OUT/" 2>/dev/null \
            || say "no $name.json written (see $name.log in logs.tar.gz)"
    done
fi

for log in "$logs"/study_world*.log; do  # each study's own table
    [ -f "$log" ] && { echo "--- $(basename "$log")"; sed -n '/^world size/,$p' "$log"; } >> "$summary"
done
tar -czf "$OUT/logs.tar.gz" -C "$logs" .
say "done; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
cat "$summary"
