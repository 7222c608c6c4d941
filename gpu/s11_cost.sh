#!/usr/bin/env bash
# Issue 12, session 11: the recording's price with the new mark cadence (16 launches, no
# period bound; gap and synchronize marks as before), shim + daemon, recording switched on and
# off between neighbouring decode steps inside one process (gpu/step_ab.py), beside the
# cadences it replaces — each variant one process, the daemon started first:
#   default   16 launches, period off, stream writes   (this build's default)
#   s10       8 launches, 100 µs period, stream writes (the default before; never measured)
#   every8    8 launches, period off
#   every32   32 launches, period off
#   events16  16 launches, period off, event records (opt-in mode)
# then the shim's own time for the default (self_cost) and split by phase (phases), and the
# method's bias with no shim.
#   bash gpu/s11_cost.sh OUT      (binaries: $NEW, default .bench/s11)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
install -d -m 755 /opt/wp-s11 && install -m 755 "${NEW:-$PWD/.bench/s11}"/* /opt/wp-s11/
NEW=/opt/wp-s11; SHIM=$NEW/libcupti_shim.so
export PYTHONUNBUFFERED=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
printf 'listen = "127.0.0.1:19466"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/daemon.toml"
"$NEW/wedgeprobe" daemon --config "$OUT/daemon.toml" 2> "$OUT/daemon.log" & D=$!
sleep 1
ab() {  # label, step_ab args, env…
  local label=$1 args=$2; shift 2
  echo "=== $label: $*"
  env "$@" AB_LABEL=$label CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=toggle \
    taskset -c 2-9 timeout 120 python3 gpu/step_ab.py $args > "$OUT/$label.out" 2> "$OUT/$label.err"
  echo "  exit $?"; grep -vE "^\s*$" "$OUT/$label.out" | tail -6
  grep "wedgeprobe shim" "$OUT/$label.err" | grep -v "measurement switch" | head -3
}
ab default "16 300 150" X=1
ab s10 "12 150 100" WEDGEPROBE_SHIM_MARK_EVERY=8 WEDGEPROBE_SHIM_MARK_PERIOD_US=100
ab every8 "12 150 100" WEDGEPROBE_SHIM_MARK_EVERY=8
ab every32 "12 150 100" WEDGEPROBE_SHIM_MARK_EVERY=32
ab events16 "12 150 100" WEDGEPROBE_SHIM_MARK_WITH=event
ab default-again "12 150 100" X=1
kill -INT $D; wait $D 2>/dev/null
echo "daemon events: $(grep -o '"event":"[a-z_]*"' "$OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
echo "daemon verdicts: $(grep -o '"kind":"[a-z_]*"' "$OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
for m in self_cost phases; do
  echo "=== $m, eager decode, default cadence"
  CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=$m \
    taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|phase|generations|rror" | head -6 | cut -c1-900
done
echo "=== bias: no shim"
AB_LABEL=none taskset -c 2-9 timeout 100 python3 gpu/step_ab.py 8 100 50 2>&1 | grep -vE "^\s*$" | tail -6
