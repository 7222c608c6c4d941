#!/usr/bin/env bash
# Issue 3's PyTorch/Triton check: the Triton kernel stuck behind a host-pinned flag is named
# by `wedgeprobe run`, and the program's result is the same with and without the shim.
#   gpu/torch_check.sh
set -u
WP=${WP:-$PWD/target/release/wedgeprobe}
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1
echo "=== without the shim (reference result)"
timeout 120 python3 gpu/torch_wedge.py 3 3000
echo; echo "=== wedgeprobe run -- python3 gpu/torch_wedge.py 12 3000"
timeout 180 "$WP" run -- python3 gpu/torch_wedge.py 12 3000
echo "run exit: $?"
