#!/usr/bin/env bash
# Issue 12 (and 15's cost), session 10, the final build on a quiet machine:
#  1. recording on/off between neighbouring decode steps inside one process, the daemon
#     started *before* the process (the case that used to push the shim onto CUPTI's
#     callbacks): gpu/step_ab.py; the shim's log shows whether its hooks were in;
#  2. self cost of eager decode (no phase timer);
#  3. the issue's turns: nothing, shim, shim + daemon, and a process attached by
#     `wedgeprobe attach` after its warm-up (issue 15's cost beside a started shim).
#   bash gpu/s10_final_a.sh OUT      (binaries: $NEW, default .bench/s10)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
# Binaries in a root-owned directory: `attach` refuses a shim someone else could replace.
install -d -m 755 /opt/wp-s10 && install -m 755 "${NEW:-$PWD/.bench/s10}"/* /opt/wp-s10/
export NEW=/opt/wp-s10; SHIM=$NEW/libcupti_shim.so
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
echo "=== 1. step_ab, daemon started first"
printf 'listen = "127.0.0.1:19466"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/ab-daemon.toml"
"$NEW/wedgeprobe" daemon --config "$OUT/ab-daemon.toml" 2> "$OUT/ab-daemon.log" & D=$!
sleep 1
AB_LABEL=shim+daemon CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=toggle \
  taskset -c 2-9 timeout 150 python3 gpu/step_ab.py 16 300 150 > "$OUT/ab.out" 2> "$OUT/ab.err"
echo "step_ab exit $?"; grep -vE "^\s*$" "$OUT/ab.out" | tail -7
grep "wedgeprobe shim" "$OUT/ab.err" | head -4
kill -INT $D; wait $D 2>/dev/null
echo "daemon events: $(grep -o '"event":"[a-z_]*"' "$OUT/ab-daemon.log" | sort | uniq -c | tr '\n' ' ')"
echo "daemon verdicts: $(grep -o '"kind":"[a-z_]*"' "$OUT/ab-daemon.log" | sort | uniq -c | tr '\n' ' ')"
grep -E '"event":"(awaiting_shim|attached)"' "$OUT/ab-daemon.log" | head -3
echo "=== 2. self cost, eager decode"
CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=self_cost \
  taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-700
echo "=== 3. turns: nothing, shim, shim + daemon, attached"
NEW=$NEW timeout 300 python3 gpu/serve_turns.py "$OUT/turns" --sides base,shim,shim_daemon,attached \
  --per-side 2 --rounds 4 --pin 2-9 2>&1 | tail -40
cp "$OUT/turns/turns.jsonl" "$OUT/turns.jsonl" 2>/dev/null
