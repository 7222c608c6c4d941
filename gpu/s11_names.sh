#!/usr/bin/env bash
# Issue 12 and 15, session 11, on a GPU nothing else uses: the naming shapes with the new mark
# cadence (gpu/marks_check.sh: launch, synchronize, lazy load, burst, graph capture and
# explicit, exact mode beside, PyTorch/Triton, 4 ranks), then issue 15's attach (eager and
# graph, gpu/attach_check.sh) and its refusal of a process whose libcuda entry points carry
# another wedgeprobe's uprobes (exit 11), then the attach once those are gone.
#   bash gpu/s11_names.sh OUT      (binaries: $NEW, default .bench/s11, installed in $DEST,
#                                   default /opt/wp-s11; gpu/s12_names.sh runs it on session 12's)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
DEST=${DEST:-/opt/wp-s11}
install -d -m 755 "$DEST" && install -m 755 "${NEW:-$PWD/.bench/s11}"/* "$DEST"/
export NEW=$DEST PYTHONUNBUFFERED=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
echo "=== issue 12: the naming shapes"
WP=$NEW/wedgeprobe timeout 300 bash gpu/marks_check.sh "$OUT/marks" 2>&1 | grep -vE "^\s*$" | cut -c1-600
echo "=== issue 15: attach"
timeout 150 bash gpu/attach_check.sh "$OUT/attach" 2>&1 | cut -c1-600
echo "=== issue 15: attach refused while watch's uprobes are on libcuda, then attached"
python3 gpu/attach_loop.py eager 14 19 > "$OUT/bp.out" 2> "$OUT/bp.err" & P=$!
for _ in $(seq 1 180); do grep -q '^ready' "$OUT/bp.out" && break; sleep 0.5; done
"$NEW/wedgeprobe" watch --pid $P --duration 30s > "$OUT/bp.watch" 2>&1 & W=$!
for _ in $(seq 1 40); do grep -q 'watching pid' "$OUT/bp.watch" && break; sleep 0.25; done
head -1 "$OUT/bp.watch"
"$NEW/wedgeprobe" attach --pid $P; echo "  attach under watch: exit $?"
kill -INT $W; wait $W 2>/dev/null
"$NEW/wedgeprobe" attach --pid $P; echo "  attach after watch ended: exit $?"
sleep 12
"$NEW/wedgeprobe" report --pid $P --kernel-floor 2s 2>&1 | grep -E "^process|shim was put|STUCK|VERDICT|verdict" | head -4 | cut -c1-500
wait $P; echo "  reproducer exit $?"; tail -1 "$OUT/bp.out"
