#!/usr/bin/env bash
# FlashAttention-4 beside ours, SDPA cuDNN and SDPA flash at the attention table's long
# shapes, on one Hopper GPU: install the wheels in WHEELS (flash-attn-4 and its needs; a
# wheel may also come unpacked, as NAME.tar.xz or in pieces NAME.tar.xz.part*, which is
# smaller to carry), check its outputs against an fp32 reference (check.py), then run the
# table's perf cases at those shapes, then each forward and backward apart (split.py).
#   SYSTEMS_COMMIT=<sha> WHEELS=<dir> OUT=<dir> bash studies/attention_fa4/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${SYSTEMS_COMMIT:?set SYSTEMS_COMMIT to the commit this tree is}"
: "${WHEELS:?set WHEELS to the folder of wheels}"
OUT=${OUT:?set OUT to the folder that collects the results}
export SYSTEMS_COMMIT PYTHONUNBUFFERED=1
site=$(mktemp -d)
for tarball in $(ls "$WHEELS" | sed -n 's/\(\.tar\.xz\)\(\.part.*\)\?$/\1/p' | sort -u); do
    cat "$WHEELS/$tarball"* | tar -xJ -C "$site" || { echo "cannot unpack $tarball"; exit 1; }
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$WHEELS"/*.whl > "$OUT/pip.log" 2>&1 || { echo "pip failed"; tail "$OUT/pip.log"; exit 1; }
# --target installs leave .pth files unread: put the folders they name on the path
extra=$(cat "$site"/*.pth 2>/dev/null | grep -v '^import' | sed "s|^|$site/|" | paste -sd:)
export PYTHONPATH=src:$site${extra:+:$extra}
python3 -c "import flash_attn.cute, importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'), 'cutlass-dsl', m.version('nvidia-cutlass-dsl'))" 2>&1 | tee "$OUT/versions.txt"
# The attention table's four long shapes, checked and split here, selected by -k below.
SHAPES=(--shape 1x16x16384x64 --shape 1x16x16384x128 --shape 4x16x4096x64 --shape 4x16x4096x128)
timeout 240 python3 -m studies.attention_fa4.check "${SHAPES[@]}" 2>&1 | tee "$OUT/check.log"
check=${PIPESTATUS[0]}
echo "check: exit $check"
[ "$check" = 0 ] || exit "$check"
timeout 300 python3 -m pytest tests/perf/test_attention.py --perf-profile=quick -p no:cacheprovider \
    -k "table and (16384 or 4x16x4096)" --benchmark-json="$OUT/table_fa4.json" \
    > "$OUT/table_fa4.log" 2>&1
echo "table: exit $? $(tail -n 1 "$OUT/table_fa4.log")"
timeout 240 python3 -m studies.attention_fa4.split --out "$OUT/split.json" \
    --commit "$SYSTEMS_COMMIT" "${SHAPES[@]}" > "$OUT/split.log" 2>&1
echo "split: exit $?"; cat "$OUT/split.log"
