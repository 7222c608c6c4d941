#!/usr/bin/env bash
# Last H200 checks of this session: Python frames behind a blocked launch in a real PyTorch
# process, then the daemon's cost again (8 PyTorch processes) with the bounded-work changes.
#   bash gpu/final_check.sh OUT
set -u
OUT=${1:-/tmp/wpfin}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
echo "=== report on torch_wedge.py (shim): python frames of the blocked thread"
CUDA_INJECTION64_PATH=$SHIM PYTHONUNBUFFERED=1 python3 gpu/torch_wedge.py 14 3000 > "$OUT/torch.out" 2>&1 & p=$!
sleep 9
"$WP" report --pid $p > "$OUT/torch.report.txt"; echo "exit $?"
grep -E "BLOCKED|python:|verdict" "$OUT/torch.report.txt" | cut -c1-400
wait $p
bash gpu/daemon_bounds.sh "$OUT/db" 2>&1 | grep "daemon:"
