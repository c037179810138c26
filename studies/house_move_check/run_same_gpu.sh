#!/usr/bin/env bash
# The 2.7b ctx 512 step of the tree before the moves (8a23c16, checked out as .before/) and
# of this tree, timed in turn on one GPU: this tree, the old one, this tree again, each a
# pytest process of its own (cold compiles included, about two minutes each on an H100).
# Run from the repository root:
#   git worktree add .before 8a23c16   (or any checkout of it at .before/)
#   SYSTEMS_COMMIT=<sha of this tree> OUT=<dir> bash studies/house_move_check/run_same_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${SYSTEMS_COMMIT:?set SYSTEMS_COMMIT to the commit this tree is}"
OUT=${OUT:?set OUT to the folder that collects the results}
PY=${PYTHON:-python3}
after=$SYSTEMS_COMMIT
select=(tests/perf/test_training_recipes.py --perf-profile=quick -p no:cacheprovider
        -k "2.7b and ctx512 and (optimized or pytorch_baseline)")
run() {  # LABEL TREE COMMIT
    local label=$1 tree=$2 commit=$3
    ( cd "$tree" && SYSTEMS_COMMIT=$commit PYTHONPATH=src timeout 200 "$PY" -m pytest \
        "${select[@]}" --benchmark-json="$OUT/$label.json" ) > "$OUT/$label.log" 2>&1
    echo "$label ($commit): exit $? $(tail -n 1 "$OUT/$label.log")"
}
mkdir -p "$OUT"
run after1 . "$after"
run before .before 8a23c16
run after2 . "$after"
