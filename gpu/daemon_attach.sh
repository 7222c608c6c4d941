# Sourced by the GPU benchmark scripts: start `wedgeprobe daemon` (JSON logs) and wait until it
# has attached to a process, so attaching is not measured.
#   daemon_attached WEDGEPROBE CONFIG LOG PID   → sets $d to the daemon's pid
daemon_attached() {
  local wp=$1 config=$2 log=$3 pid=$4
  "$wp" daemon --config "$config" 2> "$log" & d=$!
  for _ in $(seq 1 300); do
    grep '"event":"attached"' "$log" 2>/dev/null | grep -q "\"pid\":$pid" && break
    sleep 0.1
  done
  grep '"event":"attached"' "$log" | grep -q "\"pid\":$pid" || echo "daemon did not attach to $pid ($log)"
  sleep 1
}
