#!/usr/bin/env bash
# Session 7's last GPU call: a boot-deadlock pair with the shim reported 22 s after start (host
# stall with the same-stack rule), then the healthy serving loop under the daemon.
#   bash gpu/final_issue13_12.sh OUT HEALTHY_SECONDS
set -u
OUT=${1:-/tmp/wpfinal}; SECS=${2:-440}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}; SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
d=$(mktemp -d)
for r in 0 1; do CUDA_INJECTION64_PATH=$SHIM python3 gpu/host_handshake.py $r $d 60 > "$OUT/hs.$r.out" 2>&1 & eval "P$r=$!"; done
sleep 22
"$WP" report --pid $P0 --json > "$OUT/hs.json" 2> "$OUT/hs.err"; echo "report exit $?"
python3 -c "
import json; r=json.load(open('$OUT/hs.json')); print('verdict:', r['verdict']['kind'], '-', r['verdict']['summary'][:400])
for h in r['host_stalls']:
    for t in h['threads']: print('  same_stack_ms', round(t['same_stack_ms']), 'busy_ms', round(t['busy_ms']), 'gpu_evidence', h['gpu_evidence'], 'no_gpu_progress_ms', round(h['no_gpu_progress_ms']))"
kill $P0 $P1 2>/dev/null; wait
NEW=$(dirname "$WP") bash gpu/healthy_serving.sh "$OUT/healthy" "$SECS"
