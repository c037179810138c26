#!/usr/bin/env bash
# This GPU's baseline and the gate's demonstration (docs/benchmarking.md): record the quick
# profile as the baseline, re-run it unchanged against the baseline RERUNS times, then once
# with an injected 15% slowdown of the end-to-end steps. Re-runs and the injected run are
# saved as studies; each run's log (with the gate's table) goes to OUTDIR.
# Usage: scripts/gate_demonstration.sh OUTDIR [RERUNS]
# Needs python3 with torch, Triton, pytest-benchmark and pytest-timeout (no install step, so
# it runs on machines without a package index); set SYSTEMS_COMMIT where .git is absent.
set -uo pipefail
out=${1:?usage: $0 OUTDIR [RERUNS]}
reruns=${2:-3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
columns=--benchmark-columns=median,iqr,mean,stddev,rounds

run() {  # NAME COMMAND...: the command's output to OUTDIR/NAME.log, its tail to stdout
    local name=$1
    shift
    echo "== $name started $(date -u +%T)"
    "$@" 2>&1 | tee "$out/$name.log" | tail -n 40
    echo "== $name exit ${PIPESTATUS[0]} $(date -u +%T)"
}

run baseline python3 -m pytest "$(python3 -m systems.bench.baseline suite)" -p no:cacheprovider \
    --perf-profile=quick --perf-baseline "$columns"
gated=(tests/perf -p no:cacheprovider --perf-profile=quick --benchmark-compare --perf-gate
       "$columns")
for i in $(seq 1 "$reruns"); do
    run "rerun$i" python3 -m pytest "${gated[@]}" --perf-study="gate_rerun$i"
done
run injected env SYSTEMS_PERF_INJECT_SLOWDOWN=test_end_to_end:0.15 \
    python3 -m pytest "${gated[@]}" --perf-study=gate_injected_end_to_end_15pct
echo "== done $(date -u +%T)"
