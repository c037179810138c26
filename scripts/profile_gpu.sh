#!/usr/bin/env bash
# Every profiling and memory command of `systems.profiling`, on one CUDA GPU (about 4 min on
# an H100), writing into OUTDIR at most seven files:
#   profile_summary_small.md, profile_summary_2.7b.md
#                           kernel summaries at ctx 512 (forward / fwd+bwd / step)
#   memory_summary.md       peak-memory table, activation arithmetic, largest allocations
#   memory_timeline.png     the 2.7b ctx 512 fp32 train step's active-memory timeline
#   profiling_docs.tar.gz   the summaries, every timeline PNG and the HTML viewers that
#                           fit: extract into docs/profiling/
#   profiling_raw.tar.gz    gzipped Chrome traces and snapshot pickles, smallest first, while
#                           they fit in 15 MB (for chrome://tracing, Perfetto, memory_viz)
#   profile_gpu.log         progress and timings
# Usage: scripts/profile_gpu.sh OUTDIR
set -euo pipefail
OUT=${1:?usage: scripts/profile_gpu.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && PY=${PYTHON:-$ROOT/.venv/bin/python}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/profile_gpu.log"
if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "error: scripts/profile_gpu.sh needs a CUDA GPU (torch.cuda.is_available() is False)." \
         "On CPU, 'python -m systems profile compute --device cpu ...' still summarises CPU ops." >&2
    exit 2
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DOCS="$WORK/profiling"
mkdir -p "$DOCS"

step() {  # step NAME COMMAND...: run, log its output and duration
    local name=$1 start=$SECONDS
    shift
    echo "== $name" | tee -a "$LOG" >&2
    "$@" > "$WORK/$name.stdout" 2> >(tee -a "$LOG" >&2)
    echo "== $name took $((SECONDS - start)) s" | tee -a "$LOG" >&2
}

pack() {  # pack ARCHIVE BUDGET_MB FILE...: tar.gz the files, smallest first, within budget
    local archive=$1 budget=$(( $2 * 1024 * 1024 )) total=0 kept=()
    shift 2
    while read -r size file; do
        if (( total + size <= budget )); then kept+=("$file"); total=$((total + size))
        else echo "left out of $(basename "$archive"): $file ($size bytes)" | tee -a "$LOG" >&2; fi
    done < <(for f in "$@"; do [ -f "$f" ] && echo "$(stat -c %s "$f") $f"; done | sort -n)
    (( ${#kept[@]} )) && tar -czf "$archive" -C "$DOCS" "${kept[@]#"$DOCS/"}"
    return 0
}

: > "$LOG"
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__)" \
    | tee -a "$LOG" >&2
step compute_small "$PY" -m systems profile compute --size small --seq-len 512 \
    --precision fp32 bf16 --warmup 2 --steps 3 --out "$DOCS/small"
step compute_2.7b "$PY" -m systems profile compute --size 2.7b --seq-len 512 \
    --precision fp32 bf16 --warmup 2 --steps 2 --out "$DOCS/2.7b"
step memory "$PY" -m systems profile memory --size 2.7b --seq-len 128 256 512 \
    --precision fp32 bf16 --mode forward train_step --steps 2 --out "$DOCS"

# One compute summary per model size, each short enough to read.
for size in small 2.7b; do
    mv "$DOCS/$size/profile_summary.md" "$DOCS/profile_summary_$size.md"
    mv "$DOCS/$size"/trace_* "$DOCS"/
    rm -r "${DOCS:?}/$size"
done

cp "$DOCS"/profile_summary_*.md "$DOCS/memory_summary.md" "$OUT/"
cp "$DOCS/memory_2.7b_ctx512_train_step_fp32.png" "$OUT/memory_timeline.png" 2>/dev/null || true
pack "$OUT/profiling_docs.tar.gz" 14 "$DOCS"/*.md "$DOCS"/*.png "$DOCS"/*.html
pack "$OUT/profiling_raw.tar.gz" 15 "$DOCS"/trace_*.json.gz "$DOCS"/snapshot_*.pickle.gz
echo "done in $SECONDS s; outputs:" | tee -a "$LOG" >&2
ls -la "$OUT" | tee -a "$LOG" >&2
