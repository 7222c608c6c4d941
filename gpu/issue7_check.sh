#!/usr/bin/env bash
# Issue 7 on the nvidia-h200-x2 machine: a real NCCL job, rank 1 stuck in a Triton kernel
# before the all-reduce, rank 0 waiting in ncclDevKernel_AllReduce_*. wedgeprobe report over
# both PIDs must name rank 1 as the culprit; the daemon's flight-recorder dump shows both.
#   bash gpu/issue7_check.sh OUT
set -u
OUT=${1:-/tmp/wp7}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
python3 -c 'import torch; print("GPUs:", torch.cuda.device_count())'
printf 'listen = "127.0.0.1:19464"\ndump_dir = "%s/dumps"\nkernel_floor = "3s"\n' "$OUT" > /tmp/wp7.toml
"$WP" daemon --config /tmp/wp7.toml 2> "$OUT/daemon.log" & D=$!
CUDA_INJECTION64_PATH=$SHIM PYTHONUNBUFFERED=1 timeout 120 \
  torchrun --nproc-per-node 2 gpu/nccl_two_ranks.py ${REL:-25} > "$OUT/job.log" 2>&1 &
for _ in $(seq 1 60); do [ "$(grep -c ready "$OUT/job.log")" = 2 ] && break; sleep 1; done
sleep 8
pids=$(grep -o 'pid [0-9]*' "$OUT/job.log" | awk '{printf "--pid %s ", $2}')
echo "=== wedgeprobe report $pids --kernel-floor 3s"
"$WP" report $pids --kernel-floor 3s --json > "$OUT/report.json"; echo "exit $?"
"$WP" report $pids --kernel-floor 3s | tail -14
curl -s 127.0.0.1:19464/metrics | grep -E '^wedgeprobe_(culprit|verdict)\{'
wait %2 2>/dev/null; cat "$OUT/job.log" | grep -v Warning | tail -8
sleep 2; kill -INT $D; wait $D
grep -E '"culprit"|culprit|dump' "$OUT/daemon.log" | cut -c1-300
ls -la "$OUT/dumps" 2>/dev/null
echo "=== flight-recorder dumps: events per rank process"
for f in "$OUT"/dumps/*.trace.json.gz; do
  [ -e "$f" ] || continue
  python3 - "$f" $(grep -o 'pid [0-9]*' "$OUT/job.log" | awk '{print $2}') <<'PY'
import gzip, json, sys
events = json.load(gzip.open(sys.argv[1]))
events = events.get("traceEvents", events) if isinstance(events, dict) else events
procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
for pid, name in sorted(procs.items()):
    n = sum(1 for e in events if e.get("pid") == pid and e.get("ph") != "M")
    print(sys.argv[1].rsplit("/", 1)[-1], "|", name, "|", n, "events")
print("rank pids:", sys.argv[2:])
PY
done
