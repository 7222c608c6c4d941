#!/usr/bin/env bash
# Issue 12, session 12, the device time left (~4 min): (1) whether the driver's memory fence
# before each stream-write mark is what makes a mark cost eager decode about twice its host
# time — the same build, marks written with and without CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
# (measurement switch `no_barrier`), alternating processes, recording on/off pairs as in
# gpu/s12_cost.sh; (2) the captured-graph naming shape again (marks), released after 15 s
# instead of 9: in sessions 11 and 12 a report that took ~5 s found the reproducer gone.
#   bash gpu/s12_extra.sh OUT      (binaries: $NEW, default .bench/s12)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
SRC=${NEW:-$PWD/.bench/s12}
install -d -m 755 /opt/wp-s12x && install -m 755 "$SRC/pf2/libcupti_shim.so" "$SRC/wedgeprobe" /opt/wp-s12x/
NEW=/opt/wp-s12x
export PYTHONUNBUFFERED=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/graph_wedge gpu/graph_wedge.cu -lpthread &
NV=$!
ab() {  # label, measure switches
  echo "=== $1: WEDGEPROBE_SHIM_MEASURE=$2"
  AB_LABEL=$1 CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=$2 \
    taskset -c 2-9 timeout 90 python3 gpu/step_ab.py 8 100 50 > "$OUT/$1.out" 2> "$OUT/$1.err"
  echo "  exit $?"; grep -vE "^\s*$" "$OUT/$1.out" | tail -5
}
ab fence toggle
ab no-fence toggle,no_barrier
ab fence-again toggle
ab no-fence-again toggle,no_barrier
wait $NV
echo "=== graph-capture-marks, released after 15 s"
CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so /tmp/graph_wedge capture 15 2> "$OUT/gc.stderr" & P=$!
sleep 4.5
"$NEW/wedgeprobe" report --pid $P --kernel-floor 2s > "$OUT/gc.report" 2>&1; echo "  report exit $?"
grep -E "STUCK|^verdict|graph" "$OUT/gc.report" | head -4 | cut -c1-500
wait $P; echo "  reproducer exit $?"
