#!/usr/bin/env bash
# Waits for gpu/s10_final_b.sh's healthy run to end (at most $1 s), then prints its summary.
#   bash gpu/s10_collect.sh SECONDS OUT
set -u
WAIT=${1:-560}; OUT=${2:?out dir}; mkdir -p "$OUT"
# Meanwhile (GPU shared with the healthy run, cores 2-9): recording on/off with sparser marks
# beside the default, one process each — what the mark cadence is worth.
export PYTHONUNBUFFERED=1
SHIM=/opt/wp-s10/libcupti_shim.so
for cfg in "default:" "sparse:WEDGEPROBE_SHIM_MARK_EVERY=16,WEDGEPROBE_SHIM_MARK_PERIOD_US=5000"; do
  label=${cfg%%:*}; extra=${cfg#*:}
  env ${extra//,/ } AB_LABEL=$label CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=toggle,self_cost \
    taskset -c 2-9 timeout 150 python3 gpu/step_ab.py 16 200 100 2>&1 | grep -vE "^\s*$|Warning|warn" \
    | sed 's/wedgeprobe shim: self cost: /  self cost (on-steps): /' | cut -c1-330 | tail -8
done
for _ in $(seq 1 "$WAIT"); do [ -e /tmp/healthy/done ] && break; sleep 1; done
echo "healthy run: $(( $(date +%s) - $(cat /tmp/healthy/started) )) s since it started; done: $([ -e /tmp/healthy/done ] && echo yes || echo no)"
cat /tmp/healthy/summary.txt
cp /tmp/healthy/daemon.log "$OUT/healthy-daemon.log" 2>/dev/null
cp /tmp/healthy/metrics.txt "$OUT/healthy-metrics.txt" 2>/dev/null
tail -3 /tmp/healthy/loop.out 2>/dev/null
