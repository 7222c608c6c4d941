# Sourced by the cost scripts (gpu/s12_cost.sh, gpu/s13_cost.sh): the daemon started first,
# then one process of recording on/off pairs (gpu/step_ab.py) per variant, then the daemon's
# events and verdicts.
#   cost_ab_start OUT WEDGEPROBE          the daemon, logging to OUT/daemon.log
#   cost_ab LABEL SHIM_DIR [ENV=V …]      one process; OUT/LABEL.{out,err}
#   cost_ab_stop                          the daemon stopped, its events and verdicts
#   COST_AB_OFF                           the env of "marks off" (only the mark after a sync)
COST_AB_OFF="WEDGEPROBE_SHIM_MARK_EVERY=1048576 WEDGEPROBE_SHIM_MARK_US=60000000"
cost_ab_start() {
  COST_AB_OUT=$1
  export PYTHONUNBUFFERED=1
  [ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
  printf 'listen = "127.0.0.1:19466"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$1" > "$1/daemon.toml"
  "$2" daemon --config "$1/daemon.toml" 2> "$1/daemon.log" & COST_AB_DAEMON=$!
  sleep 1
}
cost_ab() {
  local label=$1 shim=$2; shift 2
  echo "=== $label ($(basename "$shim")): $*"
  env "$@" AB_LABEL=$label CUDA_INJECTION64_PATH=$shim/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=toggle \
    taskset -c 2-9 timeout 120 python3 gpu/step_ab.py 12 150 100 > "$COST_AB_OUT/$label.out" 2> "$COST_AB_OUT/$label.err"
  echo "  exit $?"; grep -vE "^\s*$" "$COST_AB_OUT/$label.out" | tail -5
  grep "wedgeprobe shim" "$COST_AB_OUT/$label.err" | grep -v "measurement switch" | head -3
}
cost_ab_stop() {
  kill -INT "$COST_AB_DAEMON"; wait "$COST_AB_DAEMON" 2>/dev/null
  echo "daemon events: $(grep -o '"event":"[a-z_]*"' "$COST_AB_OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
  echo "daemon verdicts: $(grep -o '"kind":"[a-z_]*"' "$COST_AB_OUT/daemon.log" | sort | uniq -c | tr '\n' ' ')"
}
