#!/usr/bin/env bash
# Issue 12's benchmark on the GPU machine: the recorder's price on a serving-shaped workload
# (gpu/serve_bench.py: eager decode tokens/s, CUDA-graph decode steps/s) and on the
# launch-bound loop (gpu/torch_bench.py), sides interleaved within one run, the order rotated
# every round, medians over rounds (BENCHMARKS.md).
#
#   ROUNDS=3 SIDES="base shim shim_daemon exact old_shim old_daemon" bash gpu/serve_bench.sh OUT
#
# Sides: base (nothing), shim (the shim, default recording: stream marks), shim_daemon (+
# `wedgeprobe daemon`, attached before the measurement starts), exact
# (WEDGEPROBE_SHIM_RECORD=exact: a CUPTI record per kernel), exact_daemon, n32 (marks every 32
# launches), skip_X (measurement switch WEDGEPROBE_SHIM_SKIP=X: launch, graph, sync, capture,
# resource, activity, subscribe — those CUPTI pieces left off, to price each; X may be a
# comma list), hooks_off (marks, launches recorded through CUPTI's callbacks instead of the
# launch hooks), cupti_off (the shim loaded but off), old_shim / old_daemon (the binaries in $OLD, the release before this change).
# WORKLOAD=serve (default) or torch (the launch-bound loop).
set -u
OUT=${1:-/tmp/wpserve}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/target/release}
OLD=${OLD:-$PWD/.bench/old}
ROUNDS=${ROUNDS:-3}
SIDES=${SIDES:-base shim shim_daemon exact}
WORKLOAD=${WORKLOAD:-serve}
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
source "$(dirname "$0")/daemon_attach.sh"
echo 1 > /proc/sys/kernel/bpf_stats_enabled
printf 'listen = "127.0.0.1:19464"\ndump_dir = "%s/dumps"\nlog_format = "json"\n' "$OUT" > "$OUT/daemon.toml"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
case $WORKLOAD in
  serve) CMD=(python3 gpu/serve_bench.py "${REPS:-3}" "${GRAPH_S:-3}") ;;
  torch) CMD=(python3 gpu/torch_bench.py "${SECS:-2}") ;;
esac
for r in $(seq 1 "$ROUNDS"); do
  set -- $SIDES; for _ in $(seq 2 "$r"); do set -- "$@" "$1"; shift; done
  for side in "$@"; do
    go=$OUT/go.$side.$r; rm -f "$go"
    bin=$NEW; envs=(WP_GO="$go"); daemon=
    case $side in
      shim) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so) ;;
      shim_daemon) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so); daemon=1 ;;
      exact) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_RECORD=exact) ;;
      exact_daemon) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_RECORD=exact); daemon=1 ;;
      skip_*) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_SKIP=${side#skip_}) ;;
      hooks_off) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_HOOKS=off) ;;
      cupti_off) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM=off) ;;
      n32) envs+=(CUDA_INJECTION64_PATH=$NEW/libcupti_shim.so WEDGEPROBE_SHIM_MARK_EVERY=32) ;;
      old_shim) bin=$OLD; envs+=(CUDA_INJECTION64_PATH=$OLD/libcupti_shim.so) ;;
      old_daemon) bin=$OLD; envs+=(CUDA_INJECTION64_PATH=$OLD/libcupti_shim.so); daemon=1 ;;
    esac
    env "${envs[@]}" timeout 300 ${PIN:+taskset -c "$PIN"} "${CMD[@]}" > "$OUT/$side.$r.out" 2> "$OUT/$side.$r.err" &
    py=$!
    for _ in $(seq 1 1200); do grep -q ready "$OUT/$side.$r.out" 2>/dev/null && break; sleep 0.1; done
    d=; pypid=$(pgrep -P $py python3 | head -1)
    [ -n "$daemon" ] && daemon_attached "$bin/wedgeprobe" "$OUT/daemon.toml" "$OUT/$side.$r.daemon" "$pypid"
    touch "$go"; wait $py
    if [ -n "$d" ]; then
      # The kernel's accounting of the daemon's eBPF programs over the run (bpf_stats).
      awk '/^prog_id/ {id=$2} /^run_time_ns/ {t=$2} /^run_cnt/ {print "prog", id, "runs", $2, "ns", t}' \
        /proc/$d/fdinfo/* 2>/dev/null | sort -u > "$OUT/$side.$r.bpfstats"
      kill -INT $d; wait $d 2>/dev/null
    fi
    echo "round $r $side $(tail -1 "$OUT/$side.$r.out") $(grep -c 'wedgeprobe shim' "$OUT/$side.$r.err") shim-lines"
  done
done
python3 - "$OUT" "$WORKLOAD" $SIDES <<'PY'
import json, glob, statistics, sys
out, workload, sides = sys.argv[1], sys.argv[2], sys.argv[3:]
keys = ["eager_tok_s", "graph_steps_s"] if workload == "serve" else ["eager_ns_per_kernel", "graph_ns_per_kernel"]
higher_better = workload == "serve"
res = {}
for s in sides:
    rows = []
    for f in sorted(glob.glob(f"{out}/{s}.*.out")):
        try:
            rows.append(json.loads(open(f).read().strip().splitlines()[-1]))
        except Exception:
            pass
    res[s] = rows
med = {s: {k: statistics.median(r[k] for r in rows) for k in keys} for s, rows in res.items() if rows}
base = med.get("base")
print(f"| side | rounds | {keys[0]} | vs base | {keys[1]} | vs base | each round ({keys[0]}; {keys[1]}) |")
print("|---|---|---|---|---|---|---|")
for s in sides:
    if s not in med:
        print(f"| {s} | 0 | - | - | - | - | |"); continue
    m = med[s]
    def rel(k):
        if not base: return "-"
        d = m[k] / base[k] - 1
        return f"{100 * (d if higher_better else d):+.1f}%"
    each = "; ".join(f"{r[keys[0]]:.0f}/{r[keys[1]]:.1f}" for r in res[s])
    print(f"| {s} | {len(res[s])} | {m[keys[0]]:,.1f} | {rel(keys[0])} | {m[keys[1]]:,.1f} | {rel(keys[1])} | {each} |")
if workload == "serve":
    # The launching thread's CPU time per eager decode step: less noisy than wall time here.
    print()
    print("| side | eager CPU ms/step (median) | vs base | each round |")
    print("|---|---|---|---|")
    cb = None
    for s in sides:
        v = [r["eager_cpu_ms_per_step"] for r in res.get(s, []) if "eager_cpu_ms_per_step" in r]
        if not v:
            continue
        m = statistics.median(v)
        cb = cb or (m if s == "base" else None)
        rel = f"{100 * (m / cb - 1):+.1f}%" if cb else "-"
        print(f"| {s} | {m:.3f} | {rel} | {', '.join(f'{x:.3f}' for x in v)} |")
PY
