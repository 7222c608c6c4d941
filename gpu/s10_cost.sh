#!/usr/bin/env bash
# Issue 12, session 10: the shim's price after the hot-path rework (one thread-local per
# launch, masked capacities, prefetched journal lines) and with event marks, on the H200.
#  1. self cost (WEDGEPROBE_SHIM_MEASURE=self_cost), C launch loop: the session-9 build with
#     stream-write marks (~ session 8's final) and with event marks, the new build — all with
#     the phase timer (comparable), the new build without it (its own figure) — and bare;
#  2. self cost on eager decode, new build, with and without the phase timer;
#  3. recording on/off between neighbouring decode steps inside one process (gpu/step_ab.py)
#     with the daemon attached throughout, and once without the shim (the method's bias);
#  4. the issue's side-by-side turns: nothing, shim, shim + daemon (gpu/serve_turns.py).
#   bash gpu/s10_cost.sh OUT      (binaries: $NEW, default .bench/s10; old shim: $OLD)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/.bench/s10}; SHIM=$NEW/libcupti_shim.so
OLD=${OLD:-$PWD/.bench/s9/libcupti_shim.so}
BIN=/tmp/wp-gpu; mkdir -p $BIN
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o $BIN/launch_bench gpu/launch_bench.cu || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; grep -c 3dnowprefetch /proc/cpuinfo | sed 's/^/cpus with prefetchw: /'

echo "=== 1. self cost, C launch loop (300k launches), rounds interleaved"
for r in 1 2 3; do
  for side in bare old-write old-event new-phases new; do
    case $side in
      bare) env=() ;;
      old-write) env=(CUDA_INJECTION64_PATH=$OLD WEDGEPROBE_SHIM_MARK_WITH=write WEDGEPROBE_SHIM_MEASURE=self_cost) ;;
      old-event) env=(CUDA_INJECTION64_PATH=$OLD WEDGEPROBE_SHIM_MEASURE=self_cost) ;;
      new-phases) env=(CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=self_cost,phases) ;;
      new) env=(CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=self_cost) ;;
    esac
    line=$(env "${env[@]}" taskset -c 2 $BIN/launch_bench 300000 2>&1 \
      | grep -E "self cost|launches 300000" | sed 's/wedgeprobe shim: self cost: //' | tr '\n' ' ' | cut -c1-420)
    echo "$side $r: $line"
  done
done

echo "=== 2. self cost, eager decode (3 generations after a warm-up), new build"
for m in self_cost self_cost,phases; do
  echo "--- $m"
  CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=$m \
    taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-700
done

echo "=== 3. recording on/off between neighbouring steps, daemon attached (gpu/step_ab.py)"
printf 'listen = "127.0.0.1:19466"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/ab-daemon.toml"
"$NEW/wedgeprobe" daemon --config "$OUT/ab-daemon.toml" 2> "$OUT/ab-daemon.log" & D=$!
sleep 1
AB_LABEL=shim+daemon CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=toggle \
  taskset -c 2-9 timeout 170 python3 gpu/step_ab.py 12 250 120 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -8
kill -INT $D; wait $D 2>/dev/null
echo "daemon verdicts during step_ab: $(grep -o '"kind":"[a-z_]*"' "$OUT/ab-daemon.log" | sort | uniq -c | tr '\n' ' ')"
AB_LABEL=none taskset -c 2-9 timeout 100 python3 gpu/step_ab.py 4 100 50 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -7

echo "=== 4. turns: nothing, shim, shim + daemon"
NEW=$NEW timeout 240 python3 gpu/serve_turns.py "$OUT/turns" --sides base,shim,shim_daemon \
  --per-side 2 --rounds 4 --pin 2-9 2>&1 | tail -32
cp "$OUT/turns/turns.jsonl" "$OUT/turns.jsonl" 2>/dev/null
