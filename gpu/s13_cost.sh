#!/usr/bin/env bash
# Issue 12, prepared in session 12 for the next device time: the hot-line layout (commits
# a69da8f and 5ac8b49, "hot") against the prefetch build the H200 measured in session 12 ("pf", commit
# 192b44c), shim + daemon, recording on/off pairs inside each process (gpu/step_ab.py), the
# builds alternating process by process so drift between minutes cancels; then each build
# with marks off (the recording's own share) and the shim's self cost of each.
#   bash gpu/s13_cost.sh OUT      (binaries: $NEW, default .bench/s13/{pf,hot}, .bench/s13/wedgeprobe; rebuild
#   them from those commits if .bench is gone: strip the release libcupti_shim.so of each)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
SRC=${NEW:-$PWD/.bench/s13}
for v in pf hot; do install -d -m 755 /opt/wp-s13/$v && install -m 755 "$SRC/$v/libcupti_shim.so" /opt/wp-s13/$v/; done
install -m 755 "$SRC/wedgeprobe" /opt/wp-s13/
NEW=/opt/wp-s13
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
}
ab pf-1 pf X=1
ab hot-1 hot X=1
ab pf-2 pf X=1
ab hot-2 hot X=1
ab pf-off pf $OFF
ab hot-off hot $OFF
ab hot-3 hot X=1
ab pf-3 pf X=1
kill -INT $D; wait $D 2>/dev/null
echo "daemon events: $(grep -o '"event":"[a-z_]*"' "$OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
echo "daemon verdicts: $(grep -o '"kind":"[a-z_]*"' "$OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
for b in hot pf hot; do
  echo "=== self_cost, eager decode, $b"
  CUDA_INJECTION64_PATH=$NEW/$b/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost \
    taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-500
done
