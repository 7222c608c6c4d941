#!/usr/bin/env bash
# Runs on the GPU machine (no Rust there: target/release/wedgeprobe travels with the tree).
# Builds the CUDA reproducer and benchmark with nvcc, then checks wedgeprobe against the real
# driver. Every reproducer releases itself (host-mapped flag + device deadline).
#   gpu/validate.sh OUT_DIR [steps…]   steps: info wedge bench (default: all)
set -u
OUT=${1:?out dir}; shift
STEPS=${*:-info wedge bench}
WP=${WP:-$PWD/target/release/wedgeprobe}
BIN=/tmp/wp-gpu
mkdir -p "$BIN" "$OUT"
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
NVCC=/usr/local/cuda/bin/nvcc
$NVCC -O2 -arch=sm_90 -o $BIN/mbarrier_wedge gpu/mbarrier_wedge.cu -lpthread || exit 1
$NVCC -O2 -arch=sm_90 -o $BIN/launch_bench gpu/launch_bench.cu || exit 1
LIBCUDA=$(readlink -f /usr/local/nvidia/lib64/libcuda.so.1)

step() { echo; echo "=== $*"; }

if [[ " $STEPS " == *" info "* ]]; then
  step info
  nvidia-smi -L; uname -r; echo "libcuda: $LIBCUDA"
  nm -DS --defined-only "$LIBCUDA" | grep -E ' (cuLaunchKernel|cuLaunchKernel_ptsz|cuLaunchKernelEx|cuStreamSynchronize|cuCtxSynchronize|cuModuleGetFunction|cuLibraryGetKernel)$'
fi

# $1 mode, $2 release_s, $3 delay_s, $4 sleep before attach, $5 tag, $6… wedgeprobe args
wedge_case() {
  local mode=$1 rel=$2 delay=$3 pause=$4 tag=$5; shift 5
  step "$tag: mbarrier_wedge $mode $rel $delay; wedgeprobe $* after ${pause}s"
  $BIN/mbarrier_wedge "$mode" "$rel" "$delay" 2>"$OUT/$tag.reproducer.log" &
  local pid=$!
  sleep "$pause"
  ps -L -o tid,comm,stat,pcpu -p $pid
  WEDGEPROBE_DEBUG_SCAN=1 "$WP" "$@" --pid $pid 2>"$OUT/$tag.stderr" | tee "$OUT/$tag.txt"
  echo "wedgeprobe exit: ${PIPESTATUS[0]}"
  grep -m3 "^scan" "$OUT/$tag.stderr" | cut -c1-400
  wait $pid; echo "reproducer exit: $?"; cat "$OUT/$tag.reproducer.log"
}

if [[ " $STEPS " == *" wedge "* ]]; then
  # The 3 a.m. case: attach after the wedge (threads found by stack scan).
  wedge_case launch 12 0 4 launch-after report
  wedge_case sync 12 0 4 sync-after report --json
  # Attached first: the uprobes see the calls begin (exact times, stream, grid, names).
  wedge_case launch 9 3 0.5 launch-before report --window 7s
  wedge_case sync 9 3 0.5 sync-before watch --duration 14s
  # Crossing latency: in_call_ms at the `blocked` event minus the 1 s bound.
  wedge_case launch 9 3 0.5 launch-before-json watch --json --duration 14s
fi

if [[ " $STEPS " == *" bench "* ]]; then
  # Three sides interleaved, order rotated each round (the machine drifts): bare, wedgeprobe
  # watch (launches with an entry probe only, the default), watch --launch-returns.
  step "bench: launch_bench 200000 x ${ROUNDS:=5} rounds: bare | watch | watch --launch-returns"
  old_stats=$(cat /proc/sys/kernel/bpf_stats_enabled)
  echo 1 > /proc/sys/kernel/bpf_stats_enabled
  sides=(bare watch returns)
  for round in $(seq 1 $ROUNDS); do
    for k in 0 1 2; do
      side=${sides[$(( (k + round) % 3 ))]}
      $BIN/launch_bench 200000 3 > "$OUT/bench.$round.$side" &
      pid=$!
      case $side in
        watch) sleep 1; "$WP" watch --pid $pid > /dev/null & wpid=$! ;;
        returns) sleep 1; "$WP" watch --launch-returns --pid $pid > /dev/null & wpid=$! ;;
      esac
      if [ $side != bare ]; then
        # The kernel's own accounting of our programs (bpf_stats_enabled): fdinfo of the
        # probe's program fds, sampled until the target exits.
        ( while kill -0 $pid 2>/dev/null; do
            awk '/^prog_id/ {id=$2} /^run_time_ns/ {t=$2} /^run_cnt/ {print id, t, $2}' \
              /proc/$wpid/fdinfo/* 2>/dev/null > "$OUT/stats.tmp.$side" &&
              mv "$OUT/stats.tmp.$side" "$OUT/stats.$round.$side"
            sleep 0.3
          done ) &
      fi
      wait $pid
      [ $side != bare ] && wait $wpid
      echo "round $round $side $(cat "$OUT/bench.$round.$side")"
    done
  done | tee "$OUT/bench.txt"
  echo "$old_stats" > /proc/sys/kernel/bpf_stats_enabled
  step "eBPF program cost (kernel bpf_stats: run_time_ns / run_cnt), last round"
  for side in watch returns; do
    # Program ids follow load order: call_enter, call_exit, name_enter, name_exit,
    # sched_yield, on_cpu (probe-user/src/probe.rs).
    echo "$side:"; sort -n "$OUT/stats.$ROUNDS.$side" | awk 'BEGIN {split("call_enter call_exit name_enter name_exit sched_yield on_cpu", n)}
      {printf "  %-12s runs %9d  avg %6.0f ns\n", n[NR], $3, $3 ? $2/$3 : 0}'
  done
fi
