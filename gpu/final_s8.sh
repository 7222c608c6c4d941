#!/usr/bin/env bash
# Session 8's last GPU call: the shim's self cost by phase (C loop, eager decode), then every
# named shape with the final build (gpu/marks_check.sh).
#   bash gpu/final_s8.sh OUT   (binaries in .bench/final)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
FINAL=$PWD/.bench/final
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
BIN=/tmp/wp-gpu; mkdir -p $BIN
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o $BIN/launch_bench gpu/launch_bench.cu || exit 1
echo "=== self cost by phase: C loop, 300k launches"
for r in 1 2; do
  CUDA_INJECTION64_PATH=$FINAL/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost taskset -c 2 \
    $BIN/launch_bench 300000 2>&1 | grep -E "self cost|launches 300000"
done
echo "=== self cost by phase: eager decode"
CUDA_INJECTION64_PATH=$FINAL/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost taskset -c 2-9 \
  timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4
echo "=== named shapes, final build"
WP=$FINAL/wedgeprobe timeout 330 bash gpu/marks_check.sh "$OUT/marks" > "$OUT/marks.log" 2>&1
echo "marks_check rc $?"
grep -E "^===|verdict:|head:|rank |culprit|VERDICT" "$OUT/marks.log" | cut -c1-260
