#!/usr/bin/env bash
# Where a serving process's time goes with the shim (and with the daemon beside it): a perf
# profile of the target itself during the eager decode of gpu/serve_bench.py, per side, sorted
# by library and symbol. perf is brought from the development machine (see
# gpu/profile_daemon.sh for how the kit is made), here from $KIT.
#   KIT=.bench/perfkit SIDES="base shim shim_daemon" bash gpu/profile_target.sh OUT
set -u
OUT=${1:-/tmp/wpprof}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/target/release}
KIT=${KIT:-$PWD/.bench/perfkit}
SIDES=${SIDES:-base shim shim_daemon}
PERF() { LD_LIBRARY_PATH=$KIT/lib "$KIT/perf" "$@"; }
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
source "$(dirname "$0")/daemon_attach.sh"
printf 'listen = "127.0.0.1:19464"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/daemon.toml"
export PYTHONUNBUFFERED=1
for side in $SIDES; do
  go=$OUT/go.$side; rm -f "$go"
  envs=(WP_GO="$go"); daemon=
  case $side in
    shim) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so) ;;
    shim_daemon) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so); daemon=1 ;;
    exact) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_RECORD=exact) ;;
  esac
  env "${envs[@]}" timeout 200 python3 gpu/serve_bench.py 4 1 > "$OUT/$side.out" 2> "$OUT/$side.err" &
  py=$!
  for _ in $(seq 1 1200); do grep -q ready "$OUT/$side.out" 2>/dev/null && break; sleep 0.1; done
  pypid=$(pgrep -P $py python3 | head -1)
  d=
  [ -n "$daemon" ] && daemon_attached "$NEW/wedgeprobe" "$OUT/daemon.toml" "$OUT/$side.daemon" "$pypid"
  touch "$go"; sleep 0.5
  PERF record -F 1999 -g -o "$OUT/$side.perf" -p "$pypid" -- sleep 3 > "$OUT/$side.record.log" 2>&1
  wait $py
  [ -n "$d" ] && { kill -INT $d; wait $d 2>/dev/null; }
  echo "=== $side: $(tail -1 "$OUT/$side.out")"
  PERF report -i "$OUT/$side.perf" --no-children --sort dso --percent-limit 0.5 --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -14
  PERF report -i "$OUT/$side.perf" --no-children --sort dso,sym --percent-limit 0.4 --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
done
