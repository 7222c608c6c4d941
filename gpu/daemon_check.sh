#!/usr/bin/env bash
# H200: the daemon's cost with 8 PyTorch processes (default config), then
# the daemon on a real wedge with the same build (verdict, dump, metrics).
#   bash gpu/daemon_check.sh OUT
set -u
OUT=${1:-/tmp/wpdaemon}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/mbarrier_wedge gpu/mbarrier_wedge.cu -lpthread 2>/dev/null &
echo "=== daemon bounds, default config"
WEDGEPROBE_DEBUG_TICK=1 bash gpu/daemon_bounds.sh "$OUT/db" > "$OUT/db.log" 2>&1
grep -E "^daemon|^config" "$OUT/db.log"
grep "per tick" "$OUT/db/daemon.log" | tail -1
wait
echo "=== daemon on mbarrier_wedge launch 14 (shim), default config"
printf 'listen = "127.0.0.1:19465"\ndump_dir = "%s/dumps"\n' "$OUT" > /tmp/wpw.toml
"$WP" daemon --config /tmp/wpw.toml 2> "$OUT/wedge-daemon.log" & D=$!
sleep 3
CUDA_INJECTION64_PATH=$SHIM /tmp/mbarrier_wedge launch 14 > "$OUT/wedge.out" 2>&1 & W=$!
sleep 10
curl -s 127.0.0.1:19465/metrics | grep -E "^wedgeprobe_(oldest_kernel_age_seconds|inflight_kernels|verdict|blocked_threads)\{" | grep -v 'kind="healthy"} 0' | cut -c1-300
wait $W
sleep 1
kill -INT $D; wait $D 2>/dev/null
cat "$OUT/wedge.out"
cut -c1-400 "$OUT/wedge-daemon.log"
ls -la "$OUT/dumps" | tail -n +2
