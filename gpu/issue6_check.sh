#!/usr/bin/env bash
# Issue 6 on one GPU: 4 rank processes share the H200; rank 2 wedges in a non-collective kernel,
# ranks 0, 1, 3 wait in an NCCL-named collective for it. wedgeprobe report over the 4 PIDs must
# name rank 2 as the culprit. Then the daemon's own cost with 8 PyTorch processes on the GPU.
#   bash gpu/issue6_check.sh OUT
set -u
OUT=${1:-/tmp/wp6}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/ranks gpu/ranks.cu -lpthread -lrt || exit 1
echo "=== trace of the PyTorch/Triton wedge (regenerated with this build)"
CUDA_INJECTION64_PATH=$SHIM PYTHONUNBUFFERED=1 python3 gpu/torch_wedge.py 18 3000 > "$OUT/torch.out" 2>&1 & p=$!
sleep 8
"$WP" trace --pid $p --duration 8s -o "$OUT/h200-torch-triton.trace.json.gz"; echo "trace exit $?"
wait $p; cat "$OUT/torch.out"
SHM=/wp-ranks-$$; rm -f /dev/shm$SHM
pids=()
for r in 0 1 2 3; do
  c=0; [ $r = 2 ] && c=1
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 CULPRIT=$c \
    CUDA_INJECTION64_PATH=$SHIM /tmp/ranks 14 $SHM 2>>"$OUT/ranks.log" &
  pids+=(--pid $!)
done
sleep 7
echo "=== wedgeprobe report ${pids[*]} --kernel-floor 2s"
"$WP" report "${pids[@]}" --kernel-floor 2s --json > "$OUT/ranks.report.json"; echo "exit $?"
"$WP" report "${pids[@]}" --kernel-floor 2s | tail -12
wait; cat "$OUT/ranks.log"; rm -f /dev/shm$SHM
python3 - "$OUT/ranks.report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for j in r["jobs"]:
    print("job", j["job"])
    for k in j["ranks"]:
        print("  rank", k["rank"], k["pid"], k["state"], k["kernel"], k["running_ms"])
    print("culprit:", json.dumps(j["culprit"]))
PY
bash gpu/daemon_bounds.sh "$OUT"
