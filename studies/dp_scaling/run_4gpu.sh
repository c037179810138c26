#!/usr/bin/env bash
# Data-parallel scaling on one 4-GPU machine, one phase after another: nothing else runs
# while a phase times (rounds timed beside other work on the same machine showed outliers).
# PHASES picks the phases and their order (default "study correctness baseline"):
#   study        the study at 1, 2 and 4 GPUs, one world size after another
#   correctness  the NCCL correctness tests (tests/distributed -k nccl: world sizes 2 and 4)
#   baseline     the distributed quick profile recorded as .benchmarks/<GPU>/baseline_4gpu.json
#                (as `make baseline` does, one run); BASELINE_WORLDS="4 2" also baseline_2gpu.json
# Run from the repository root; all three take 12-15 minutes (raise BUDGET_S), or split them
# into two calls of under 10 minutes each (about 5.5-7 and 5-6.5 minutes; give each its own OUT):
#   SYSTEMS_COMMIT=<sha of this tree> OUT=<dir> PHASES=study bash studies/dp_scaling/run_4gpu.sh
#   SYSTEMS_COMMIT=<sha of this tree> OUT=<dir> PHASES="correctness baseline" \
#       BASELINE_WORLDS="4 2" bash studies/dp_scaling/run_4gpu.sh
# On a 2-GPU machine: WORLDS="2 1" BASELINE_WORLDS=2 (the correctness phase runs world size 2).
# Optional: VARIANTS (the study's variants at 2 and 4 GPUs; default below), VARIANTS_1GPU
# (at 1 GPU), WORLDS (the study's world sizes, default "1 2 4"), ROUNDS, WARMUP, STEPS (the
# study's, default 3, 2, 4), WHEELS=<dir> (pip installs pytest-benchmark and py-cpuinfo2 from
# it when pytest_benchmark is missing; without it the baseline is skipped), BUDGET_S (default
# 540: no phase starts, and each is cut, so that the call ends by then), DRY_RUN=1 (CPU:
# gloo, a tiny model, three processes where the script would use four, no baseline: checks
# the plumbing).
# Writes to OUT: world1.json world2.json world4.json (the study, one per world size; commit
# them as studies/dp_scaling/runs/), baseline_4gpu.json (commit it under .benchmarks/<GPU>/),
# logs.tar.gz (every log of this call) and summary.txt (what is printed at the end).
#
# Time per phase, from XL fp32 at per-rank batch 8 x ctx 128 (a step takes about 0.4-0.45 s
# there; a variant's build, broadcast and teardown a few seconds): the study times 8
# variants x 3 rounds x (2 warm-up + 4 timed steps) = 144 steps, about 2.5-3 minutes with the
# builds, per world size (5 variants at 1 GPU); the NCCL tests take 40-90 s per world size
# (rank pools start by spawning); the quick profile is 8 train cases x 7 steps plus the
# all-reduce cases, about 100 s per world size. Caps below are ceilings, not estimates.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${SYSTEMS_COMMIT:?set SYSTEMS_COMMIT to the commit this tree is (recorded in every file)}"
export SYSTEMS_COMMIT PYTHONPATH=src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT to the folder that collects the results}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
DRY_RUN=${DRY_RUN:-0}
PHASES=${PHASES:-study correctness baseline}
VARIANTS=${VARIANTS:-none none_early_step torch_ddp bucketed bucketed_late_step fsdp fsdp_early_step torch_fsdp2}
VARIANTS_1GPU=${VARIANTS_1GPU:-none torch_ddp bucketed fsdp torch_fsdp2}
for phase in $PHASES; do
    case $phase in study|correctness|baseline) ;;
        *) echo "unknown phase '$phase' in PHASES (study, correctness, baseline)" >&2; exit 2;;
    esac
done
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
gpus() { seq -s, 0 $(( $1 - 1 )); }  # the first N GPUs

if [ "$DRY_RUN" = 1 ]; then
    study=(--backend gloo --size tiny --batch-size 2 --seq-len 16 --rounds 1 --warmup 1
           --steps 1 --bucket-size-mb 0.05 --allreduce-sizes-mb 1 --allreduce-iterations 2)
    worlds=${WORLDS:-1 2 3}; tests=(-k "gloo and (bucket_steps or prefetch_depth or layouts)")
    export OMP_NUM_THREADS=1
else
    study=(--rounds "${ROUNDS:-3}" --warmup "${WARMUP:-2}" --steps "${STEPS:-4}")
    worlds=${WORLDS:-1 2 4}; tests=(-k nccl)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$summary"
fi
say "phases: $PHASES"

run_study() {  # WORLD CAP_S
    local world=$1 want=$2 log="study_world$1.log" variants=$VARIANTS room
    (( world == 1 )) && variants=$VARIANTS_1GPU
    room=$(left); (( room < want )) && want=$room
    # the variant lists split into words
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$(gpus "$world") cap "$want" "$PY" -m torch.distributed.run \
        --standalone --nproc-per-node "$world" -m studies.dp_scaling.study \
        --out "$OUT/world$world.json" --commit "$SYSTEMS_COMMIT" \
        --time-limit-s $(( want - 60 > 30 ? want - 60 : 30 )) "${study[@]}" \
        --variants $variants > "$logs/$log" 2>&1
    say "study at $world GPU(s): exit $? ($log)"
}

phase_study() {
    for world in $worlds; do
        say "study at $world GPU(s)"
        run_study "$world" $(( world == 1 ? 150 : 200 ))
    done
}

phase_correctness() {  # every NCCL case on every GPU: world sizes 2 and 4 each run once
    say "correctness: tests/distributed ${tests[*]}"
    cap 240 "$PY" -m pytest tests/distributed -q -p no:cacheprovider "${tests[@]}" \
        > "$logs/correctness.log" 2>&1
    say "correctness: exit $?: $(tail -n 1 "$logs/correctness.log")"
}

phase_baseline() {
    if [ "$DRY_RUN" = 1 ]; then
        say "baseline: skipped in a dry run (a baseline is recorded on GPUs only)"
        return
    fi
    if ! "$PY" -c "import pytest_benchmark" 2>/dev/null && [ -n "${WHEELS:-}" ]; then
        "$PY" -m pip install -q --no-index --find-links "$WHEELS" pytest-benchmark py-cpuinfo2 \
            > "$logs/pip.log" 2>&1
    fi
    if ! "$PY" -c "import pytest_benchmark" 2>/dev/null; then
        say "baseline: skipped: no pytest-benchmark" \
            "(carry its wheel and py-cpuinfo2's; WHEELS=dir)"
        return
    fi
    local gpu world name baseline_worlds
    read -ra baseline_worlds <<< "${BASELINE_WORLDS:-4}"
    gpu=$("$PY" -c "from systems.common.hardware import device_slug; print(device_slug())")
    for world in "${baseline_worlds[@]}"; do
        name="baseline_${world}gpu"
        say "baseline: the distributed quick profile at $world GPUs as .benchmarks/$gpu/$name.json"
        CUDA_VISIBLE_DEVICES=$(gpus "$world") cap 220 "$PY" -m pytest \
            tests/perf/test_distributed.py -p no:cacheprovider --perf-profile=quick \
            --perf-baseline --benchmark-columns=median,iqr,mean,stddev,rounds \
            > "$logs/$name.log" 2>&1
        say "$name: exit $?: $(tail -n 1 "$logs/$name.log")"
        cp ".benchmarks/$gpu/$name.json" "$OUT/" 2>/dev/null \
            || say "no $name.json written (see $name.log in logs.tar.gz)"
    done
}

for phase in $PHASES; do
    "phase_$phase"
done

for log in "$logs"/study_world*.log; do  # each study's own table
    [ -f "$log" ] && { echo "--- $(basename "$log")"; sed -n '/^world size/,$p' "$log"; } >> "$summary"
done
tar -czf "$OUT/logs.tar.gz" -C "$logs" .
say "done; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
cat "$summary"
