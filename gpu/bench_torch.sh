#!/usr/bin/env bash
# Issue 3's benchmark, sides interleaved within one run (BENCHMARKS.md):
#   base      nothing attached
#   shim      CUDA_INJECTION64_PATH=libcupti_shim.so (launch callbacks + CONCURRENT_KERNEL)
#   shim_cb   session 2's measurement switch (launch callbacks only); since issue 12 the
#             default recording (stream marks) has no per-kernel records: use gpu/serve_bench.sh
#   shim_ebpf the shim + `wedgeprobe watch` attached (launch uprobes off: journal present)
#   ebpf      `wedgeprobe watch` alone (entry uprobes on launches)
#   profiler  torch.profiler (Kineto; CPU + CUDA activities)
#   ROUNDS=3 SECS=3 bash gpu/bench_torch.sh OUTDIR
set -u
OUT=${1:-/tmp/wpb}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
ROUNDS=${ROUNDS:-3} SECS=${SECS:-3}
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
SIDES="base shim shim_cb shim_ebpf ebpf profiler"
for r in $(seq 1 "$ROUNDS"); do
  # rotate the order each round
  set -- $SIDES; for _ in $(seq 2 "$r"); do set -- "$@" "$1"; shift; done
  for side in "$@"; do
    go=$OUT/go.$side.$r; rm -f "$go"
    envs=(WP_GO="$go" PYTHONUNBUFFERED=1); extra=()
    case $side in
      shim|shim_ebpf) envs+=(CUDA_INJECTION64_PATH="$SHIM");;
      shim_cb) envs+=(CUDA_INJECTION64_PATH="$SHIM");;
      profiler) extra=(profiler);;
    esac
    env "${envs[@]}" timeout 120 python3 gpu/torch_bench.py "$SECS" "${extra[@]}" \
      > "$OUT/$side.$r.out" 2> "$OUT/$side.$r.err" &
    py=$!
    for _ in $(seq 1 300); do grep -q ready "$OUT/$side.$r.out" 2>/dev/null && break; sleep 0.1; done
    pypid=$(pgrep -P $py python3)
    wp=
    case $side in
      shim_ebpf|ebpf)
        "$WP" watch --pid $pypid --json > "$OUT/$side.$r.watch" 2>&1 & wp=$!
        sleep 3;;
    esac
    touch "$go"; wait $py
    [ -n "$wp" ] && { kill -INT $wp 2>/dev/null; wait $wp; }
    echo "round $r $side $(tail -1 "$OUT/$side.$r.out")"
  done
done
python3 - "$OUT" $SIDES <<'PY'
import json, glob, statistics, sys
out, sides = sys.argv[1], sys.argv[2:]
res = {}
for s in sides:
    rows = []
    for f in sorted(glob.glob(f"{out}/{s}.*.out")):
        try:
            rows.append(json.loads(open(f).read().strip().splitlines()[-1]))
        except Exception:
            pass
    res[s] = rows
base = {k: statistics.median(r[k] for r in res["base"]) for k in ("eager_ns_per_kernel", "graph_ns_per_kernel")}
print("| side | rounds | eager ns/kernel | vs base | graph ns/kernel | vs base |")
print("|---|---|---|---|---|---|")
for s in sides:
    if not res[s]:
        print(f"| {s} | 0 | - | - | - | - |"); continue
    e = statistics.median(r["eager_ns_per_kernel"] for r in res[s])
    g = statistics.median(r["graph_ns_per_kernel"] for r in res[s])
    print(f"| {s} | {len(res[s])} | {e:,.0f} | {100*(e/base['eager_ns_per_kernel']-1):+.1f}% | {g:,.0f} | {100*(g/base['graph_ns_per_kernel']-1):+.1f}% |")
PY
