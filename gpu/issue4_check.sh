#!/usr/bin/env bash
# Issue 4 on the GPU machine: Chrome traces of the mbarrier reproducer and of the PyTorch/
# Triton wedge, a flight-recorder dump from `wedgeprobe run`, and (again) the graph report.
# Everything worth keeping is packed into OUT/issue4.tar.gz.
#   bash gpu/issue4_check.sh OUT
set -u
OUT=${1:-/tmp/wp4}; W=/tmp/wp4work; rm -rf "$W"; mkdir -p "$OUT" "$W/keep"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
NVCC=/usr/local/cuda/bin/nvcc
$NVCC -O2 -arch=sm_90 -o $W/mbarrier_wedge gpu/mbarrier_wedge.cu -lpthread || exit 1
$NVCC -O2 -arch=sm_90 -o $W/graph_wedge gpu/graph_wedge.cu -lpthread || exit 1
K=$W/keep

echo "=== trace: mbarrier_wedge launch 14 (shim), trace 8 s from t=2 s"
CUDA_INJECTION64_PATH=$SHIM $W/mbarrier_wedge launch 14 > $K/mbarrier.out 2>&1 & p=$!
sleep 2
"$WP" trace --pid $p --duration 8s -o $K/mbarrier.trace.json.gz; echo "trace exit $?"
wait $p; echo "reproducer exit $?"; cat $K/mbarrier.out

echo "=== trace: torch_wedge.py 16 3000 (shim), trace 8 s from t=6 s"
CUDA_INJECTION64_PATH=$SHIM PYTHONUNBUFFERED=1 python3 gpu/torch_wedge.py 16 3000 > $K/torch.out 2>&1 & p=$!
sleep 6
"$WP" trace --pid $p --duration 8s -o $K/torch.trace.json; echo "trace exit $?"
wait $p; echo "torch exit $?"; cat $K/torch.out

echo "=== trace: eBPF-only, mbarrier_wedge sync 10"
$W/mbarrier_wedge sync 10 > $K/mbarrier_ebpf.out 2>&1 & p=$!
sleep 2
"$WP" trace --pid $p --duration 4s -o $K/mbarrier_ebpf.trace.json; echo "trace exit $?"
wait $p

echo "=== flight recorder: wedgeprobe run --kernel-floor 2s -- mbarrier_wedge launch 10"
"$WP" run --kernel-floor 2s --flight-dir $K/flight -- $W/mbarrier_wedge launch 10; echo "run exit $?"
ls -la $K/flight

echo "=== graph report (captured graph, middle node stuck)"
CUDA_INJECTION64_PATH=$SHIM $W/graph_wedge capture 12 > $K/graph.out 2>&1 & p=$!
sleep 5
"$WP" report --pid $p --kernel-floor 2s --json > $K/graph_capture.report.json; echo "report exit $?"
wait $p; cat $K/graph.out
python3 - $K/graph_capture.report.json <<'PY'
import json,sys
r=json.load(open(sys.argv[1]))
print("verdict:", r["verdict"]["kind"], "-", r["verdict"]["summary"][:400])
for k in r["kernels"]:
    print("head:", k["kernel"], "graph:", json.dumps(k.get("graph")))
PY
tar -C $W -czf "$OUT/issue4.tar.gz" keep
ls -la "$OUT"
