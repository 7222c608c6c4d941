#!/usr/bin/env bash
# Issue 13, item 4 after session 8's change (report leaves closing its uprobe links to a child
# process): a PyTorch thread in torch.cuda.synchronize() behind a stuck Triton kernel, with and
# without the shim; `report --window 200ms` timed to its answer (stdout closed) and its exit.
#   WP=.bench/final/wedgeprobe bash gpu/report_exit.sh OUT
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
WP=${WP:-$PWD/.bench/final/wedgeprobe}; SHIM=$(dirname "$WP")/libcupti_shim.so
export PYTHONUNBUFFERED=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
CUDA_INJECTION64_PATH=$SHIM python3 gpu/sync_wedge.py 40 > "$OUT/sw.shim.out" 2>&1 & S1=$!
python3 gpu/sync_wedge.py 40 > "$OUT/sw.plain.out" 2>&1 & S2=$!
for _ in $(seq 1 300); do grep -q synchronizing "$OUT/sw.shim.out" && grep -q synchronizing "$OUT/sw.plain.out" && break; sleep 0.1; done
sleep 2
for round in 1 2; do
  for side in shim plain; do
    pid=$S1; [ $side = plain ] && pid=$S2
    WEDGEPROBE_TIMINGS=1 python3 - "$WP" "$pid" "$OUT/r.$side.$round.json" <<'PY' 2>&1 | grep -E "answer|detach|attach to" | sed "s/^/  $side $round: /"
import subprocess, sys, time
t = time.monotonic()
p = subprocess.Popen([sys.argv[1], "report", "--json", "--window", "200ms", "--pid", sys.argv[2]],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
out = p.stdout.read(); ta = time.monotonic() - t
err = p.stderr.read(); rc = p.wait(); te = time.monotonic() - t
open(sys.argv[3], "wb").write(out)
print(err.decode(errors="replace"))
print(f"answer out {ta:.2f} s, exited {te:.2f} s, exit code {rc}")
PY
  done
done
python3 - "$OUT" <<'PY'
import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/r.*.json")):
    r = json.load(open(f)); th = (r.get("threads") or [{}])[0]
    print(f.split("/")[-1], r["verdict"]["kind"], th.get("api"), th.get("blocked"), (r.get("kernels") or [{}])[0].get("kernel"))
PY
kill $S1 $S2 2>/dev/null; wait 2>/dev/null
