#!/usr/bin/env bash
# Issue 3 on the GPU machine: a CUDA graph whose middle kernel node is stuck is named (captured
# and explicit graphs), and the shim releases CUPTI for torch.profiler.
#   bash gpu/issue3_check.sh OUTDIR
set -u
OUT=${1:-/tmp/wp3}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
nvcc -O2 -arch=sm_90 -o "$OUT/graph_wedge" gpu/graph_wedge.cu -lpthread || exit 1
for mode in capture explicit; do
  echo "=== graph_wedge $mode: report --json at 6 s"
  CUDA_INJECTION64_PATH=$SHIM timeout 60 "$OUT/graph_wedge" $mode 12 > "$OUT/graph_$mode.out" 2>&1 &
  sleep 6
  pid=$(pgrep -P $! graph_wedge)
  "$WP" report --pid $pid --kernel-floor 2s --json > "$OUT/graph_$mode.json"; echo "report exit $?"
  "$WP" report --pid $pid --kernel-floor 2s > "$OUT/graph_$mode.txt"; echo "report exit $?"
  cat "$OUT/graph_$mode.txt"
  wait; echo "graph_wedge exit $?"; cat "$OUT/graph_$mode.out"
done
echo "=== wedgeprobe run -- graph_wedge capture 10"
timeout 60 "$WP" run --kernel-floor 2s -- "$OUT/graph_wedge" capture 10; echo "run exit $?"
echo "=== without the shim: graph_wedge capture 1"
timeout 60 "$OUT/graph_wedge" capture 1
for mode in none ctypes external; do
  echo "=== torch.profiler after release: $mode"
  go=$OUT/go.$mode; rm -f "$go"
  WP_GO=$go CUDA_INJECTION64_PATH=$SHIM PYTHONUNBUFFERED=1 timeout 120 python3 gpu/profiler_release.py $mode > "$OUT/rel_$mode.out" 2>&1 &
  py=$!
  if [ $mode = external ]; then
    for _ in $(seq 1 300); do grep -q ready "$OUT/rel_$mode.out" && break; sleep 0.1; done
    py=$(pgrep -P $py python3)
    "$WP" release --pid $py; echo "release exit $?"
    "$WP" report --pid $py --window 300ms --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("journal status:", r["targets"][0]["journal"]["status"])'
    touch "$go"
  fi
  wait; echo "exit $?"; cat "$OUT/rel_$mode.out"
done
