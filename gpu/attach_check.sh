#!/usr/bin/env bash
# Issue 15 on the GPU machine: a PyTorch process started without the shim, `wedgeprobe
# attach`ed while it runs, wedges later; `report` must name the stuck kernel with its grid,
# block, stream and the queue behind it. Once as an eager launch loop, once replaying a CUDA
# graph (the stuck kernel in a graph captured after the attach). The reproducer releases
# itself (a CPU thread writes the pinned flag) and prints its checksum.
#   bash gpu/attach_check.sh OUT      (binaries: $NEW, default .bench/s10)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/.bench/s10}
export PYTHONUNBUFFERED=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
summarize() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["targets"][0]
j = t.get("journal") or {}
print("  mode", r.get("mode"), "journal", j.get("status"), "attached_late", j.get("attached_late"),
      "marks_passed", j.get("marks_passed"), "drops", {k: v for k, v in (j.get("drops") or {}).items() if v})
print("  verdict:", r["verdict"]["kind"], "-", r["verdict"]["summary"][:500])
for k in r["kernels"][:2]:
    print("  head:", k.get("state"), "exact", k["exact"], k["kernel"], "grid", k["grid"], "block", k["block"],
          "device", k["device"], "stream", k["stream"], "running_ms", round(k["running_ms"]), "queued_behind", k["queued_behind"])
    for c in k.get("candidates", [])[:6]:
        print("    candidate", c["kernel"], c["grid"], c["block"])
    g = k.get("graph")
    if g:
        print("    graph: exec", g["exec_id"], "nodes", g["kernel_nodes"], "not completed:",
              [n["kernel"] for n in g["not_completed"]][:4])
PY
}
for mode in eager graph; do
  echo "=== $mode: started without the shim, attached, wedged 6 s later"
  python3 gpu/attach_loop.py $mode 6 15 > "$OUT/$mode.out" 2> "$OUT/$mode.err" & P=$!
  for _ in $(seq 1 180); do grep -q '^ready' "$OUT/$mode.out" && break; sleep 0.5; done
  grep '^ready' "$OUT/$mode.out" || { echo "  not ready"; kill $P; continue; }
  sleep 1
  /usr/bin/time -f "  attach took %e s" "$NEW/wedgeprobe" attach --pid $P 2>&1
  echo "  attach exit $?"
  grep -c "^" /proc/$P/task/*/status >/dev/null 2>&1; grep -h TracerPid /proc/$P/task/*/status | sort | uniq -c
  sleep 9
  "$NEW/wedgeprobe" report --pid $P --kernel-floor 2s --json > "$OUT/$mode.json" 2> "$OUT/$mode.report.err"
  echo "  report exit $?"
  summarize "$OUT/$mode.json"
  "$NEW/wedgeprobe" report --pid $P --kernel-floor 2s --window 200ms 2>&1 | grep -E "^process|shim was put|STUCK|verdict" | cut -c1-400
  wait $P; echo "  reproducer exit $?"
  grep -E "wedgeprobe shim|attach_loop" "$OUT/$mode.err" | head -5
  tail -1 "$OUT/$mode.out"
done
