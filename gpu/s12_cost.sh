#!/usr/bin/env bash
# Issue 12, session 12: the launch record's share of the eager cost, and whether prefetching
# a launch's journal lines at the hook's entry lowers it. Shim + daemon, recording switched on
# and off between neighbouring decode steps inside one process (gpu/step_ab.py); each variant
# one process, the daemon started first. Builds in $NEW/<variant>/libcupti_shim.so:
#   base     session 11's shim
#   pf       the lines a launch writes (ring record, in-flight slot, thread slot), predicted by
#            the thread's previous launch, prefetched for writing at the hook's entry; the
#            record mode mirrored in process memory
#   noring   pf without the ring record (a measurement build, not a product: the flight
#            recorder then has no launches), to price the ring record alone
# "marks off": WEDGEPROBE_SHIM_MARK_EVERY=1048576 WEDGEPROBE_SHIM_MARK_US=60000000 (only the
# marks after a synchronize are left), to price the recording without its marks.
#   bash gpu/s12_cost.sh OUT      (binaries: $NEW, default .bench/s12)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
SRC=${NEW:-$PWD/.bench/s12}
for v in base pf noring; do install -d -m 755 /opt/wp-s12/$v && install -m 755 "$SRC/$v/libcupti_shim.so" /opt/wp-s12/$v/; done
install -m 755 "$SRC/wedgeprobe" /opt/wp-s12/
NEW=/opt/wp-s12
export PYTHONUNBUFFERED=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
printf 'listen = "127.0.0.1:19466"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/daemon.toml"
"$NEW/wedgeprobe" daemon --config "$OUT/daemon.toml" 2> "$OUT/daemon.log" & D=$!
sleep 1
OFF="WEDGEPROBE_SHIM_MARK_EVERY=1048576 WEDGEPROBE_SHIM_MARK_US=60000000"
ab() {  # label, build, env…
  local label=$1 build=$2; shift 2
  echo "=== $label ($build): $*"
  env "$@" AB_LABEL=$label CUDA_INJECTION64_PATH=$NEW/$build/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=toggle \
    taskset -c 2-9 timeout 120 python3 gpu/step_ab.py 12 150 100 > "$OUT/$label.out" 2> "$OUT/$label.err"
  echo "  exit $?"; grep -vE "^\s*$" "$OUT/$label.out" | tail -5
  grep "wedgeprobe shim" "$OUT/$label.err" | grep -v "measurement switch" | head -3
}
ab base base X=1
ab pf pf X=1
ab base-marks-off base $OFF
ab pf-marks-off pf $OFF
ab noring-marks-off noring $OFF
ab pf-events pf WEDGEPROBE_SHIM_MARK_WITH=event
ab pf-again pf X=1
ab base-again base X=1
kill -INT $D; wait $D 2>/dev/null
echo "daemon events: $(grep -o '"event":"[a-z_]*"' "$OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
echo "daemon verdicts: $(grep -o '"kind":"[a-z_]*"' "$OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
for b in pf base; do
  echo "=== self_cost, eager decode, $b"
  CUDA_INJECTION64_PATH=$NEW/$b/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost \
    taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-700
done
