#!/usr/bin/env bash
# How long `wedgeprobe report`'s detaching child closes the report's probes after the report
# returns (BENCHMARKS.md, "Detaching"): a simulated-driver process with the shim, N reports in a
# row; after each, the time until the child is a zombie (its files, links among them, released)
# and until it is gone (reaped by pid 1, which on some VMs is slow to reap).
#   scripts/detach_child_time.sh [N]     (root; needs `cargo build -p probe-user -p cupti-shim -p wp-tests`)
set -eu
cd "$(dirname "$0")/.."
N=${1:-8}
D=$(ls -d target/debug/build/wp-tests-*/out/simcuda 2>/dev/null | head -1)
[ -x "$D/simworker" ] || { echo "no simworker: cargo build -p wp-tests" >&2; exit 2; }
WP=target/debug/wedgeprobe
CUDA_INJECTION64_PATH=$PWD/target/debug/libcupti_shim.so LD_LIBRARY_PATH=$D "$D/simworker" healthy $((N * 4 + 10)) >/dev/null 2>&1 &
W=$!
trap 'kill $W 2>/dev/null' EXIT
sleep 2
for _ in $(seq 1 "$N"); do
  "$WP" report --pid "$W" --json >/dev/null 2>&1 || true
  t0=$(date +%s.%N)
  C=$(pgrep -x wedgeprobe | head -1 || true)
  while [ -n "$C" ] && [ -e "/proc/$C" ] && ! grep -q '^State:.Z' "/proc/$C/status" 2>/dev/null; do sleep 0.005; done
  t1=$(date +%s.%N)
  while pgrep -x wedgeprobe >/dev/null; do sleep 0.01; done
  t2=$(date +%s.%N)
  printf 'closed %.2f s, gone %.2f s after the report returned\n' "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t0" | bc)"
done
