#!/usr/bin/env bash
# Issue 13 on the GPU machine, as a new user would meet it (every reproducer exits by itself):
#  1. two PyTorch processes spinning on each other host-side since before attach (with and
#     without the shim): report (defaults), watch's first verdict, the daemon's first verdict;
#  2. a thread in torch.cuda.synchronize() behind a stuck Triton kernel since before attach:
#     the API's name and age, with and without the shim;
#  4. report's wall time against PyTorch processes (WEDGEPROBE_TIMINGS=1 phases), the answer
#     out (stdout closed) vs exited; watch's time to its first verdict.
#   bash gpu/issue13_check.sh OUT
set -u
OUT=${1:-/tmp/wp13}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

# Times a command: "answer" when its stdout closes, "exit" when it exits; stdout to $2.
timed() {
  local tag=$1 file=$2; shift 2
  python3 - "$file" "$@" <<'PY' | sed "s/^/  $tag: /"
import subprocess, sys, time
t = time.monotonic()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
out = p.stdout.read(); ta = time.monotonic() - t
err = p.stderr.read(); rc = p.wait(); te = time.monotonic() - t
open(sys.argv[1], "wb").write(out)
for l in err.decode(errors="replace").splitlines():
    print(l)
print(f"answer out {ta:.2f} s, exited {te:.2f} s, exit code {rc}")
PY
}

# First line of `watch --json` matching a pattern, and when it came.
first_line() {
  local tag=$1 pat=$2; shift 2
  python3 - "$pat" "$@" <<'PY' | sed "s/^/  $tag: /"
import subprocess, sys, time, re
t = time.monotonic()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
for line in p.stdout:
    if re.search(sys.argv[1], line):
        print(f"first match after {time.monotonic() - t:.2f} s: {line.strip()[:700]}")
        break
else:
    print(f"no match in {time.monotonic() - t:.2f} s")
p.kill(); p.wait()
PY
}

summ() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("  verdict:", r["verdict"]["kind"], "-", r["verdict"]["summary"][:500])
for h in r.get("host_stalls", []):
    print("  host_stall pid", h["pid"], "no_gpu_progress_ms", round(h["no_gpu_progress_ms"]), "gpu_evidence", h["gpu_evidence"])
    for t in h["threads"][:2]:
        print("    thread", t["tid"], t["name"], "cpu_pct", t["cpu_pct"], "busy_ms", round(t["busy_ms"]),
              "native", [f.get("function") if isinstance(f, dict) else f for f in (t.get("native_stack") or [])][:4])
        print("      python", [f if isinstance(f, str) else f.get("function") for f in (t.get("python_stack") or [])][:4])
for th in r["threads"][:3]:
    print("  thread", th["tid"], th["name"], th["api"], "blocked", th["blocked"], "in_call_ms", round(th["in_call_ms"]),
          "at_least", th["in_call_at_least"], th["seen_by"], "kernel", th.get("kernel"))
    print("    python", (th.get("python_stack") or [])[:3])
for k in r.get("kernels", [])[:1]:
    print("  kernel", k["kernel"], "grid", k["grid"], "block", k["block"], "device", k["device"], "stream", k["stream"],
          "state", k.get("state"), "running_ms", round(k["running_ms"]))
PY
}

echo "=== 1. host handshake spinners, started 13 s before wedgeprobe (pair A with the shim, pair B without)"
for pair in A B; do
  d=$(mktemp -d); env=(); [ $pair = A ] && env=(CUDA_INJECTION64_PATH=$SHIM)
  for r in 0 1; do
    env "${env[@]}" python3 gpu/host_handshake.py $r $d 100 > "$OUT/hs.$pair.$r.out" 2>&1 &
    eval "HS_${pair}_$r=$!"
  done
done
sleep 13
timed "report A (shim)" "$OUT/hs.A.json" "$WP" report --pid $HS_A_0 --pid $HS_A_1 --json; summ "$OUT/hs.A.json"
timed "report B (no shim)" "$OUT/hs.B.json" "$WP" report --pid $HS_B_0 --pid $HS_B_1 --json; summ "$OUT/hs.B.json"
first_line "watch A" '"kind":"host_stall"|host_stall' timeout 8 "$WP" watch --json --pid $HS_A_0 --pid $HS_A_1
printf 'listen = "127.0.0.1:19467"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/d13.toml"
# The daemon started now: when its first verdict for each spinner comes (its log read live).
python3 - "$WP" "$OUT/d13.toml" "$OUT/d13.log" $HS_A_0 $HS_A_1 $HS_B_0 $HS_B_1 <<'PY' | sed "s/^/  daemon: /"
import json, subprocess, sys, time
wp, cfg, log, pids = sys.argv[1], sys.argv[2], sys.argv[3], {int(p) for p in sys.argv[4:]}
t0 = time.monotonic()
d = subprocess.Popen([wp, "daemon", "--config", cfg], stderr=subprocess.PIPE, text=True)
seen, out = {}, open(log, "w")
for line in d.stderr:
    out.write(line)
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "verdict" and e.get("pid") in pids and e["pid"] not in seen:
        seen[e["pid"]] = e
        print(f"first verdict for pid {e['pid']} after {time.monotonic() - t0:.2f} s: {e.get('kind')} - {str(e.get('summary'))[:300]}")
    if seen.keys() >= pids or time.monotonic() - t0 > 15:
        break
print("pids without a verdict:", sorted(pids - set(seen)))
d.send_signal(2); d.wait(timeout=90)
PY
for p in $HS_A_0 $HS_A_1 $HS_B_0 $HS_B_1; do kill $p 2>/dev/null; done; wait

echo; echo "=== 2+4. torch.cuda.synchronize() behind a stuck Triton kernel, entered 8 s before wedgeprobe"
CUDA_INJECTION64_PATH=$SHIM python3 gpu/sync_wedge.py 70 > "$OUT/sw.shim.out" 2>&1 & S1=$!
python3 gpu/sync_wedge.py 70 > "$OUT/sw.plain.out" 2>&1 & S2=$!
sleep 8
export WEDGEPROBE_TIMINGS=1
timed "report (shim), 200ms window" "$OUT/sw.shim.json" "$WP" report --pid $S1 --window 200ms --json; summ "$OUT/sw.shim.json"
timed "report (no shim), 200ms window" "$OUT/sw.plain.json" "$WP" report --pid $S2 --window 200ms --json; summ "$OUT/sw.plain.json"
timed "report (shim), default window, text" "$OUT/sw.shim.txt" "$WP" report --pid $S1
unset WEDGEPROBE_TIMINGS
first_line "watch (shim) first blocked" '"blocked"' timeout 8 "$WP" watch --json --pid $S1
first_line "watch (no shim) first blocked" '"blocked"' timeout 8 "$WP" watch --json --pid $S2
kill $S1 $S2 2>/dev/null; wait; cat "$OUT"/sw.*.out
