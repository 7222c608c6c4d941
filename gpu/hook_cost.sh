#!/usr/bin/env bash
# Issue 12, where the shim's eager cost goes on the H200 (BENCHMARKS.md, session 8):
#  1. the clock source and what each piece of the launch hook costs alone (gpu/hook_cost.cu);
#  2. the C launch loop (gpu/launch_bench.cu), one process per side and round, sides rotated:
#     base, shim, pass (hooks in place, nothing recorded), coarse (CLOCK_MONOTONIC_COARSE),
#     nomarks (no stream mark written), coarse_nomarks, old_shim / old_nomarks (the shim in
#     $OLD);
#  3. the serving model and the torch loop with recording switched on and off inside one
#     process (gpu/inproc_ab.py), one process per AB config ("label:VAR=v,VAR=v" words).
#   NEW=.bench/new OLD=.bench/old ROUNDS=5 AB_ROUNDS=14 SIDES="..." AB="..." bash gpu/hook_cost.sh OUT
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
NEW=${NEW:-$PWD/.bench/new}
SHIM=$NEW/libcupti_shim.so
OLD=${OLD:-$PWD/.bench/old}
NOMARKS="WEDGEPROBE_SHIM_MARK_EVERY=1048576 WEDGEPROBE_SHIM_MARK_US=60000000"
ROUNDS=${ROUNDS:-5}
BIN=/tmp/wp-gpu; mkdir -p $BIN
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
NVCC=/usr/local/cuda/bin/nvcc

echo "=== clock source"
cat /sys/devices/system/clocksource/clocksource0/current_clocksource \
    /sys/devices/system/clocksource/clocksource0/available_clocksource
grep -o -w 'constant_tsc\|nonstop_tsc\|tsc_known_freq\|rdtscp\|tsc_reliable' /proc/cpuinfo | sort | uniq -c
$NVCC -O2 -arch=sm_90 -o $BIN/hook_cost gpu/hook_cost.cu -lcuda || exit 1
$NVCC -O2 -arch=sm_90 -o $BIN/launch_bench gpu/launch_bench.cu || exit 1
echo "=== pieces, bare process"
taskset -c 2 $BIN/hook_cost
echo "=== pieces, under the shim (launches through the hook)"
CUDA_INJECTION64_PATH=$SHIM taskset -c 2 $BIN/hook_cost

echo "=== C launch loop, $ROUNDS rounds, sides rotated"
SIDES=${SIDES:-base shim pass coarse nomarks coarse_nomarks}
for r in $(seq 1 "$ROUNDS"); do
  set -- $SIDES; for _ in $(seq 2 "$r"); do set -- "$@" "$1"; shift; done
  for side in "$@"; do
    envs=()
    case $side in
      shim) envs=(CUDA_INJECTION64_PATH=$SHIM) ;;
      pass) envs=(CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=pass) ;;
      coarse) envs=(CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=coarse_clock) ;;
      nomarks) envs=(CUDA_INJECTION64_PATH=$SHIM $NOMARKS) ;;
      coarse_nomarks) envs=(CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=coarse_clock $NOMARKS) ;;
      old_shim) envs=(CUDA_INJECTION64_PATH=$OLD/libcupti_shim.so) ;;
      old_nomarks) envs=(CUDA_INJECTION64_PATH=$OLD/libcupti_shim.so $NOMARKS) ;;
    esac
    echo "$side $r $(env "${envs[@]}" taskset -c 2 $BIN/launch_bench 300000 2>>"$OUT/launch_bench.err")"
  done
done | tee "$OUT/launch_bench.txt"
python3 - "$OUT/launch_bench.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) >= 8:
        rows.setdefault(w[0], []).append((float(w[5]), float(w[7])))
base = statistics.median(x for x, _ in rows.get("base", [(1, 1)]))
print("| side | wall ns/launch (median) | vs base | thread CPU ns/launch | each round (wall) |")
print("|---|---|---|---|---|")
for s, v in rows.items():
    m = statistics.median(x for x, _ in v)
    print(f"| {s} | {m:,.1f} | {m - base:+,.1f} ns | {statistics.median(c for _, c in v):,.1f} | "
          + ", ".join(f"{x:,.0f}" for x, _ in v) + " |")
PY

for ab in ${AB:-default: coarse:WEDGEPROBE_SHIM_MEASURE=coarse_clock}; do
  label=${ab%%:*}; extra=${ab#*:}
  echo "=== in-process on/off: $label ($extra)"
  env CUDA_INJECTION64_PATH=$SHIM WEDGEPROBE_SHIM_MEASURE=toggle AB_LABEL=$label ${extra//,/ } \
    taskset -c 2-9 python3 gpu/inproc_ab.py "$OUT/inproc_ab.jsonl" "${AB_ROUNDS:-14}" 0.4 0.3 \
    2>>"$OUT/inproc_ab.err"
done
