#!/usr/bin/env bash
# Issue 12, session 8: the shim's own cost on the H200 from the shim itself
# (WEDGEPROBE_SHIM_MEASURE=self_cost), on the C launch loop and the serving model's eager
# decode, for the shims in $NEW and $OLDJ (the journal writer before session 8) and for mark
# settings; then the event-marks probe (gpu/event_marks.cu).
#   NEW=.bench/new OLDJ=.bench/oldj bash gpu/self_cost.sh OUT
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/.bench/new}; OLDJ=${OLDJ:-$PWD/.bench/oldj}
BIN=/tmp/wp-gpu; mkdir -p $BIN
NVCC=/usr/local/cuda/bin/nvcc
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
$NVCC -O2 -arch=sm_90 -o $BIN/launch_bench gpu/launch_bench.cu || exit 1
$NVCC -O2 -arch=sm_90 -o $BIN/event_marks gpu/event_marks.cu -lcuda -lpthread || echo "event_marks: BUILD FAILED"
echo "=== C launch loop, self cost (300k launches each)"
for r in 1 2 3; do
  for s in new oldj; do
    dir=$NEW; [ $s = oldj ] && dir=$OLDJ
    line=$(CUDA_INJECTION64_PATH=$dir/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost taskset -c 2 $BIN/launch_bench 300000 2>&1 | grep -E "self cost|launches 300000" | tr '\n' ' ')
    echo "$s $r: $line"
  done
done
echo "=== eager decode, self cost (4 generations after a warm-up)"
for cfg in "new:" "oldj:" "new_m32_us100:WEDGEPROBE_SHIM_MARK_EVERY=32" "new_m32_us500:WEDGEPROBE_SHIM_MARK_EVERY=32,WEDGEPROBE_SHIM_MARK_US=500"; do
  label=${cfg%%:*}; extra=${cfg#*:}; dir=$NEW; [ "${label%%_*}" = oldj ] && dir=$OLDJ
  echo "--- $label ($extra)"
  env CUDA_INJECTION64_PATH=$dir/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost ${extra//,/ } \
    taskset -c 2-9 timeout 120 python3 gpu/self_cost.py 4 2>&1 | grep -E "self cost|generations|Error|error" | head -5
done
echo "=== event marks probe"
timeout 60 $BIN/event_marks 2>&1 | tail -12
