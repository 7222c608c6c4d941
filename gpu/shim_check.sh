#!/usr/bin/env bash
# The CUPTI shim on the real driver (issue 3, first light): the mbarrier reproducer runs with
# CUDA_INJECTION64_PATH; wedgeprobe report must find its journal and name the stuck kernel.
#   gpu/shim_check.sh OUT_DIR
set -u
OUT=${1:?out dir}
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
BIN=/tmp/wp-gpu
mkdir -p "$BIN" "$OUT"
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o $BIN/mbarrier_wedge gpu/mbarrier_wedge.cu -lpthread 2>/dev/null || exit 1
ls /usr/local/cuda/extras/CUPTI/lib64/ /usr/local/cuda/lib64/libcupti* 2>&1 | head
for mode in launch sync; do
  echo; echo "=== shim, mode $mode: report after 7 s"
  CUDA_INJECTION64_PATH=$SHIM $BIN/mbarrier_wedge $mode 14 0 2>"$OUT/shim-$mode.stderr" &
  pid=$!
  sleep 7
  ls -la /dev/shm | grep wedgeprobe
  "$WP" report --pid $pid
  echo "wedgeprobe exit: $?"
  "$WP" report --json --pid $pid > "$OUT/shim-$mode.json"
  wait $pid; echo "reproducer exit: $?"; cat "$OUT/shim-$mode.stderr"
done
echo; echo "=== healthy run with the shim: results unchanged, completions recorded"
CUDA_INJECTION64_PATH=$SHIM $BIN/mbarrier_wedge launch 1 2 2>"$OUT/shim-healthy.stderr" &
pid=$!; sleep 0.5
"$WP" report --window 5s --pid $pid | grep -E "mode|journal|oldest|verdict|pid .* dev"
wait $pid; echo "reproducer exit: $?"; cat "$OUT/shim-healthy.stderr"

echo; echo "=== wedgeprobe run -- mbarrier_wedge launch 9 (verdict once the kernel passes the 5 s floor)"
"$WP" run -- $BIN/mbarrier_wedge launch 9 0
echo "run exit: $?"

echo; echo "=== shim cost: launch_bench 200000, bare vs shim (CUDA_INJECTION64_PATH), ${ROUNDS:=3} rounds interleaved"
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o $BIN/launch_bench gpu/launch_bench.cu 2>/dev/null
for round in $(seq 1 $ROUNDS); do
  for side in bare shim; do
    if [ $(( round % 2 )) = 0 ]; then side=$([ $side = bare ] && echo shim || echo bare); fi
    if [ $side = shim ]; then
      echo "round $round shim $(CUDA_INJECTION64_PATH=$SHIM $BIN/launch_bench 200000 2>&1 | tail -1)"
    else
      echo "round $round bare $($BIN/launch_bench 200000 2>&1 | tail -1)"
    fi
  done
done
