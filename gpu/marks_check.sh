#!/usr/bin/env bash
# Issue 12 on the GPU machine: what the shim names with stream marks (the default) and with
# per-kernel records (WEDGEPROBE_SHIM_RECORD=exact), in every shape that names a kernel today:
# a launch blocked behind the stuck kernel, a synchronize behind it, a lazy module load behind
# it, the stuck kernel launched in a burst (marks cannot bracket it alone: candidates), a stuck
# CUDA-graph node, a PyTorch/Triton wedge, and the culprit rank among 4 processes on one GPU.
# Every reproducer releases itself.
#   bash gpu/marks_check.sh OUT
set -u
OUT=${1:-/tmp/wpmarks}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
NVCC=/usr/local/cuda/bin/nvcc
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
for f in mbarrier_wedge graph_wedge; do
  $NVCC -O2 -arch=sm_90 -o /tmp/$f gpu/$f.cu -lpthread || echo "$f: BUILD FAILED"
done
$NVCC -O2 -arch=sm_90 -o /tmp/ranks gpu/ranks.cu -lpthread -lrt || echo "ranks: BUILD FAILED"

# One line per report: verdict, the head's kernel (or its candidates), grid/block, queue.
summarize() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["targets"][0]
j = t.get("journal") or {}
print("  journal:", j.get("record"), "status", j.get("status"), "marks_passed", j.get("marks_passed"),
      "completions", j.get("completions_seen"), "drops", {k: v for k, v in (j.get("drops") or {}).items() if v})
print("  verdict:", r["verdict"]["kind"], "-", r["verdict"]["summary"][:400])
for k in r["kernels"][:2]:
    print("  head: state", k.get("state"), "exact", k["exact"], "kernel", k["kernel"], "grid", k["grid"], "block", k["block"],
          "device", k["device"], "stream", k["stream"], "running_ms", round(k["running_ms"]), "queued_behind", k["queued_behind"])
    for c in k.get("candidates", [])[:6]:
        print("    candidate", c["correlation"], c["kernel"], c["grid"], c["block"])
    g = k.get("graph")
    if g:
        print("    graph: exec", g["exec_id"], "nodes", g["kernel_nodes"], "completed", g["completed"], "node_progress", g["node_progress"],
              "not completed:", [n["kernel"] for n in g["not_completed"]][:4])
for th in r["threads"][:3]:
    print("  thread", th["name"], th["api"], "blocked", th["blocked"], round(th["in_call_ms"]), "ms", th["seen_by"], "yield/s", round(th["sched_yield_per_s"] or 0))
PY
}

case_() {  # tag, record mode, command…
  local tag=$1 rec=$2; shift 2
  echo; echo "=== $tag (WEDGEPROBE_SHIM_RECORD=$rec): $*"
  CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_RECORD=$rec "$@" 2> "$OUT/$tag.stderr" &
  local pid=$!
  sleep 4.5
  "$WP" report --pid $pid --kernel-floor 2s --json > "$OUT/$tag.json" 2> "$OUT/$tag.report.err"
  echo "  report exit $?"
  summarize "$OUT/$tag.json"
  wait $pid; echo "  reproducer exit $?; $(grep -c 'wedgeprobe shim' "$OUT/$tag.stderr") shim lines"
  grep 'wedgeprobe shim' "$OUT/$tag.stderr" | head -2
}

for mode in launch sync lazy burst; do
  case_ $mode-marks marks /tmp/mbarrier_wedge $mode 9
done
case_ burst-exact exact /tmp/mbarrier_wedge burst 9
case_ launch-exact exact /tmp/mbarrier_wedge launch 9
case_ graph-capture-marks marks /tmp/graph_wedge capture 15
case_ graph-capture-exact exact /tmp/graph_wedge capture 15
case_ graph-explicit-marks marks /tmp/graph_wedge explicit 15

echo; echo "=== PyTorch/Triton wedge under wedgeprobe run (marks)"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1 timeout 120 "$WP" run --kernel-floor 2s --no-flight -- python3 gpu/torch_wedge.py 10 3000 > "$OUT/torch.out" 2>&1
echo "run exit $?"; grep -E "VERDICT|CULPRIT|candidates|one of" "$OUT/torch.out" | head -4 | cut -c1-600

echo; echo "=== 4 ranks on one GPU, rank 2 stuck (marks)"
SHM=/wp-ranks-$$; rm -f /dev/shm$SHM
pids=()
for r in 0 1 2 3; do
  c=0; [ $r = 2 ] && c=1
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 CULPRIT=$c \
    CUDA_INJECTION64_PATH=$SHIM /tmp/ranks 12 $SHM 2>>"$OUT/ranks.log" &
  pids+=(--pid $!)
done
sleep 6
"$WP" report "${pids[@]}" --kernel-floor 2s --json > "$OUT/ranks.json"; echo "report exit $?"
wait; rm -f /dev/shm$SHM
python3 - "$OUT/ranks.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for j in r["jobs"]:
    for k in j["ranks"]:
        print("  rank", k["rank"], k["state"], (k["kernel"] or "")[:160])
    print("  culprit:", (j["culprit"] or {}).get("summary"))
PY
