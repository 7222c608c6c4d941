#!/usr/bin/env bash
# Issue 12: a healthy serving loop (gpu/serve_bench.py loop: eager decode and CUDA-graph
# replays, legitimately busy GPU) with the shim, watched by `wedgeprobe daemon` for SECONDS;
# then every verdict the daemon logged for it. Anything but healthy/busy is a false alarm.
#   bash gpu/healthy_serving.sh OUT SECONDS
set -u
OUT=${1:-/tmp/wphealthy}; SECS=${2:-600}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/target/release}
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
printf 'listen = "127.0.0.1:19465"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/daemon.toml"
"$NEW/wedgeprobe" daemon --config "$OUT/daemon.toml" 2> "$OUT/daemon.log" & D=$!
PYTHONUNBUFFERED=1 CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so \
  timeout $((SECS + 120)) python3 gpu/serve_bench.py loop "$SECS" > "$OUT/loop.out" 2> "$OUT/loop.err" & P=$!
sleep 3; C=$(pgrep -P $P | head -1); echo "$C" > "$OUT/loop.pid"
wait $P; echo "loop exit $?" >> "$OUT/loop.out"
curl -s 127.0.0.1:19465/metrics > "$OUT/metrics.txt"
kill -INT $D; wait $D 2>/dev/null
python3 - "$OUT" "$C" <<'PY'
import json, sys, collections
out, loop_pid = sys.argv[1], int(sys.argv[2] or 0)
kinds, pids = collections.Counter(), {}
for line in open(f"{out}/daemon.log"):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "attached":
        pids[e["pid"]] = e.get("comm")
    if e.get("event") == "verdict":
        kinds[(e.get("pid"), e.get("comm", pids.get(e.get("pid"))), e.get("kind"))] += 1
print("loop:", open(f"{out}/loop.out").read().strip().replace("\n", " | "))
print("daemon attached:", pids)
print("verdicts logged (pid, comm, kind): count; the healthy loop is pid", loop_pid)
for k, n in sorted(kinds.items(), key=str):
    print("  ", "LOOP" if k[0] == loop_pid else "    ", k, n)
bad = [k for k in kinds if k[0] == loop_pid and k[2] not in ("healthy", "busy")]
print("healthy loop: false alarms:", bad if bad else "none")
PY
grep -E '^wedgeprobe_(verdict|journal_dropped_total|journal_ring_lost_total|ebpf_lost_total)' "$OUT/metrics.txt" | grep -v ' 0$' | head -20
