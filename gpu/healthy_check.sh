#!/usr/bin/env bash
# Issue 3: a healthy 60 s run mixing short kernels with a legitimately long one (3 s) must
# give no wedge verdict. Prints every VERDICT line of `wedgeprobe run`.
set -u
WP=${WP:-$PWD/target/release/wedgeprobe}
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/healthy_long gpu/healthy_long.cu || exit 1
timeout 150 "$WP" run -- /tmp/healthy_long ${RUN_S:-60} 2>/tmp/run.err
echo "run exit: $?"
grep -E "VERDICT|EXITED" /tmp/run.err
echo "kernel_wedge verdicts: $(grep -c 'VERDICT   kernel_wedge' /tmp/run.err)"
