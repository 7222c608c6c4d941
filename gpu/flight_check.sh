#!/usr/bin/env bash
# Issue 4 on the GPU machine: `wedgeprobe run` keeps a flight recorder and dumps the last
# seconds (trace + report) once when the mbarrier reproducer wedges.
#   bash gpu/flight_check.sh OUT
set -u
OUT=${1:-/tmp/wpf}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o /tmp/mbarrier_wedge gpu/mbarrier_wedge.cu -lpthread 2>/dev/null || exit 1
"$WP" run --kernel-floor 2s --flight-dir "$OUT/flight" -- /tmp/mbarrier_wedge launch 10; echo "run exit $?"
ls -la "$OUT/flight"
