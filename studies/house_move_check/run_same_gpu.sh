#!/usr/bin/env bash
# The 2.7b ctx 512 step of the tree before the moves (8a23c16, checked out as .before/) and
# of this tree, timed in turn on one GPU, each run a pytest process of its own (cold
# compiles included: up to about four minutes on an H100 for a tree's first run, about a
# minute and a half after). ORDER names the runs in turn (default: "after before after");
# each writes OUT/<tree><n>.json and .log, n counting that tree's runs from START (default 1).
# Run from the repository root:
#   git worktree add .before 8a23c16   (or any checkout of it at .before/)
#   SYSTEMS_COMMIT=<sha of this tree> OUT=<dir> bash studies/house_move_check/run_same_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${SYSTEMS_COMMIT:?set SYSTEMS_COMMIT to the commit this tree is}"
OUT=${OUT:?set OUT to the folder that collects the results}
PY=${PYTHON:-python3}
ORDER=${ORDER:-after before after}
select=(tests/perf/test_training_recipes.py --perf-profile=quick -p no:cacheprovider
        -k "2.7b and ctx512 and (optimized or pytorch_baseline)")
declare -A runs=([after]=$(( ${START:-1} - 1 )) [before]=$(( ${START:-1} - 1 )))
declare -A trees=([after]=. [before]=.before)
declare -A commits=([after]=$SYSTEMS_COMMIT [before]=8a23c16)
mkdir -p "$OUT"
for tree in $ORDER; do
    [ -n "${trees[$tree]:-}" ] || { echo "ORDER names after or before, not $tree"; exit 2; }
    runs[$tree]=$(( runs[$tree] + 1 ))
    label=$tree${runs[$tree]}
    ( cd "${trees[$tree]}" && SYSTEMS_COMMIT=${commits[$tree]} PYTHONPATH=src timeout 280 \
        "$PY" -m pytest "${select[@]}" --benchmark-json="$OUT/$label.json" ) \
        > "$OUT/$label.log" 2>&1
    echo "$label (${commits[$tree]}): exit $? $(tail -n 1 "$OUT/$label.log")"
done
