#!/usr/bin/env bash
# H200: `watch` across a `release` (real CUPTI, cuptiFinalize): the shim stops recording, watch
# says so and puts entry probes on launches, then sees the launch that blocks behind the later
# wedge by uprobe; no kernel is judged from the stale in-flight table.
#   bash gpu/release_check.sh OUT
set -u
OUT=${1:-/tmp/wprel}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/mbarrier_wedge gpu/mbarrier_wedge.cu -lpthread 2>/dev/null || exit 1
# Wedges 4 s after CUDA is up, released 8 s later.
CUDA_INJECTION64_PATH=$SHIM /tmp/mbarrier_wedge launch 8 4 > "$OUT/wedge.out" 2>&1 & P=$!
sleep 1
"$WP" watch --pid $P --json --duration 14s --kernel-floor 2s --no-flight > "$OUT/watch.jsonl" 2> "$OUT/watch.err" & W=$!
sleep 1.5
echo "=== wedgeprobe release --pid $P (before the wedge)"
"$WP" release --pid $P; echo "release exit $?"
wait $W; echo "watch exit $?"
wait $P
cat "$OUT/wedge.out"
echo "=== watch events"
cut -c1-330 "$OUT/watch.jsonl"
tail -3 "$OUT/watch.err"
