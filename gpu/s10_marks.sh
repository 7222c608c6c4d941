#!/usr/bin/env bash
# Issue 12, session 10, second call: what a mark really costs and how many are worth having.
#  1. gpu/event_cost.cu: an event record or a stream write after every 8th launch, by stream
#     kind and number of events cycled, timed around the call and as the loop's marginal cost;
#  2. recording on/off between neighbouring decode steps (gpu/step_ab.py) under the daemon, one
#     process per configuration: event marks (default), the period bound at 1 ms, stream writes;
#  3. self cost of eager decode with the period bound at 1 ms.
#   bash gpu/s10_marks.sh OUT      (binaries: $NEW, default .bench/s10)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/.bench/s10}; SHIM=$NEW/libcupti_shim.so
BIN=/tmp/wp-gpu; mkdir -p $BIN
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o $BIN/event_cost gpu/event_cost.cu -lcuda || exit 1

echo "=== 1. mark primitives after every 8th launch (gpu/event_cost.cu)"
taskset -c 2 timeout 120 $BIN/event_cost

echo "=== 2. recording on/off between neighbouring steps, daemon attached (gpu/step_ab.py)"
printf 'listen = "127.0.0.1:19466"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/ab-daemon.toml"
"$NEW/wedgeprobe" daemon --config "$OUT/ab-daemon.toml" 2> "$OUT/ab-daemon.log" & D=$!
sleep 1
for cfg in "events:" "period1ms:WEDGEPROBE_SHIM_MARK_PERIOD_US=1000" "writes:WEDGEPROBE_SHIM_MARK_WITH=write"; do
  label=${cfg%%:*}; extra=${cfg#*:}
  env $extra AB_LABEL=$label CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=toggle,self_cost \
    taskset -c 2-9 timeout 110 python3 gpu/step_ab.py 12 250 120 2>&1 \
    | grep -vE "^\s*$|Warning|warn" | sed 's/wedgeprobe shim: self cost: /  self cost (on-steps only): /' | cut -c1-400 | tail -9
done
kill -INT $D; wait $D 2>/dev/null
echo "daemon verdicts during step_ab: $(grep -o '"kind":"[a-z_]*"' "$OUT/ab-daemon.log" | sort | uniq -c | tr '\n' ' ')"

echo "=== 3. self cost, eager decode, period bound 1 ms"
CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=self_cost WEDGEPROBE_SHIM_MARK_PERIOD_US=1000 \
  taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-700
