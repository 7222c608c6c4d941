#!/usr/bin/env bash
# Issue 12, session 8, after the handle caches: the shim's own cost per launch
# (WEDGEPROBE_SHIM_MEASURE=self_cost) for the shim before ($OLD) and after ($NEW), on a loop of
# 1 and of 48 distinct kernels (gpu/many_kernels.cu) and on the serving model's eager decode.
#   OLD=.bench/new NEW=.bench/new2 bash gpu/self_cost2.sh OUT
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
OLD=${OLD:-$PWD/.bench/new}; NEW=${NEW:-$PWD/.bench/new2}
BIN=/tmp/wp-gpu; mkdir -p $BIN
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o $BIN/many_kernels gpu/many_kernels.cu || exit 1
$BIN/many_kernels 1000 48 | head -1
for r in 1 2; do
  for kinds in 1 48; do
    for s in old new; do
      dir=$OLD; [ $s = new ] && dir=$NEW
      line=$(CUDA_INJECTION64_PATH=$dir/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost taskset -c 2 $BIN/many_kernels 300000 $kinds 2>&1 | grep -E "self cost|kinds" | sed 's/(marks included).*over/… over/' | tr '\n' ' ')
      echo "$s kinds=$kinds round $r: $line"
    done
  done
done
for s in new old; do
  dir=$OLD; [ $s = new ] && dir=$NEW
  echo "--- eager decode, $s"
  CUDA_INJECTION64_PATH=$dir/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost taskset -c 2-9 \
    timeout 120 python3 gpu/self_cost.py 4 2>&1 | grep -E "self cost|generations|rror" | head -4
done
