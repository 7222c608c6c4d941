#!/usr/bin/env bash
# H200: the reproducers built from gpu/reproducer.cuh, one wedge under `run`, then
# the daemon's cost with 8 PyTorch processes again (with per-tick phase times).
#   bash gpu/reproducers_check.sh OUT
set -u
OUT=${1:-/tmp/wprepro}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
NVCC=/usr/local/cuda/bin/nvcc
echo "=== nvcc: the reproducers sharing gpu/reproducer.cuh"
for f in mbarrier_wedge graph_wedge; do
  $NVCC -O2 -arch=sm_90 -o /tmp/$f gpu/$f.cu -lpthread && echo "$f: built" || echo "$f: FAILED"
done
$NVCC -O2 -arch=sm_90 -o /tmp/ranks gpu/ranks.cu -lpthread -lrt && echo "ranks: built" || echo "ranks: FAILED"
echo "=== wedgeprobe run --kernel-floor 2s -- mbarrier_wedge launch 8"
"$WP" run --kernel-floor 2s --no-flight -- /tmp/mbarrier_wedge launch 8 > "$OUT/run.out" 2>&1; echo "run exit $?"
grep -E "kernel_wedge|healthy" "$OUT/run.out" | head -3 | cut -c1-300
echo "=== daemon bounds"
WEDGEPROBE_DEBUG_TICK=1 bash gpu/daemon_bounds.sh "$OUT/db" 2>&1 | grep "daemon:"
grep "per tick" "$OUT/db/daemon.log" | tail -3
