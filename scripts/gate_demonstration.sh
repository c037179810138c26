#!/usr/bin/env bash
# This GPU's baseline and the gate's demonstration (docs/benchmarking.md), one step per call
# so that each step fits a time limit:
#   baseline     record the quick profile as the baseline (first run)
#   repeat       pool one more complete run into it (run as often as BASELINE_RUNS - 1)
#   rerunN       an unchanged re-run gated against the baseline, saved as study gate_rerunN
#   injected     a re-run with a 15% slowdown injected into the timed rounds of the
#                training-recipe and end-to-end cases, saved as study gate_injected_15pct
# Each step's log (with the gate's table) goes to OUTDIR/STEP.log.
# Usage: scripts/gate_demonstration.sh OUTDIR STEP...
# Needs python3 with torch, Triton, pytest-benchmark and pytest-timeout (no install step, so
# it runs on machines without a package index); set SYSTEMS_COMMIT where .git is absent.
set -uo pipefail
out=${1:?usage: $0 OUTDIR STEP...}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
columns=--benchmark-columns=median,iqr,mean,stddev,rounds
suite=$(python3 -m systems.runs.baseline suite)
gated=("$suite" -p no:cacheprovider --perf-profile=quick --benchmark-compare --perf-gate
       "$columns")
recorded=("$suite" -p no:cacheprovider --perf-profile=quick --perf-baseline "$columns")
injected_cases=test_training_recipe:0.15,test_end_to_end:0.15

for step in "$@"; do
    echo "== $step started $(date -u +%T)"
    case $step in
        baseline) python3 -m pytest "${recorded[@]}" ;;
        repeat) python3 -m pytest "${recorded[@]}" --perf-baseline-repeat ;;
        rerun*) python3 -m pytest "${gated[@]}" --perf-study="gate_$step" ;;
        injected) SYSTEMS_PERF_INJECT_SLOWDOWN=$injected_cases \
            python3 -m pytest "${gated[@]}" --perf-study=gate_injected_15pct ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac > "$out/$step.log" 2>&1
    status=$?
    tail -n 30 "$out/$step.log"
    echo "== $step exit $status $(date -u +%T)"
done
