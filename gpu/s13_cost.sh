#!/usr/bin/env bash
# Issue 12, prepared in sessions 12 and 13 for the next device time: the hot-line layout
# (commits a69da8f, 5ac8b49, 1d2e01a and session 13's 9cfe69c: "hot") against the prefetch
# build the H200 measured in session 12 ("pf", commit 192b44c), shim + daemon, recording on/off pairs inside each process (gpu/step_ab.py), the
# builds alternating process by process so drift between minutes cancels; then each build
# with marks off (the recording's own share), "hot" counting 32 launches a mark instead of 16
# (session 11 measured 32 at -0.6 points with its build), and the shim's self cost of each;
# first, what a mark costs the GPU's stream by itself (gpu/mark_bubble.cu).
#   bash gpu/s13_cost.sh OUT      (binaries: $NEW, default .bench/s13/{pf,hot}, .bench/s13/wedgeprobe; rebuild
#   them from those commits if .bench is gone: strip the release libcupti_shim.so of each)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
SRC=${NEW:-$PWD/.bench/s13}
for v in pf hot; do install -d -m 755 /opt/wp-s13/$v && install -m 755 "$SRC/$v/libcupti_shim.so" /opt/wp-s13/$v/; done
install -m 755 "$SRC/wedgeprobe" /opt/wp-s13/
NEW=/opt/wp-s13
# What a mark costs the GPU's stream, host out of the picture (gpu/mark_bubble.cu; seconds).
echo "=== mark bubble"
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/mark_bubble gpu/mark_bubble.cu -lcuda \
  && taskset -c 2 timeout 60 /tmp/mark_bubble 5
. gpu/cost_ab.sh
cost_ab_start "$OUT" "$NEW/wedgeprobe"
OFF=$COST_AB_OFF
cost_ab pf-1 $NEW/pf X=1
cost_ab hot-1 $NEW/hot X=1
cost_ab pf-2 $NEW/pf X=1
cost_ab hot-2 $NEW/hot X=1
cost_ab pf-off $NEW/pf $OFF
cost_ab hot-off $NEW/hot $OFF
cost_ab hot-3 $NEW/hot X=1
cost_ab hot-every32 $NEW/hot WEDGEPROBE_SHIM_MARK_EVERY=32
cost_ab_stop
for b in hot pf hot; do
  echo "=== self_cost, eager decode, $b"
  CUDA_INJECTION64_PATH=$NEW/$b/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost \
    taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-500
done
