#!/usr/bin/env bash
# What `wedgeprobe watch` adds to a sched_yield (BENCHMARKS.md, "watch's price per yield"): a
# loop of sched_yield calls in a process that maps the simulated libcuda (so it is a target),
# with nothing attached and with each given wedgeprobe binary watching, interleaved by round.
# Prints ns per yield for the last 4 of 6 runs of 200,000 yields per side and round.
#   scripts/watch_yield_cost.sh [ROUNDS] WEDGEPROBE...    (as root; default: target/release/wedgeprobe)
# Needs gcc and the test build's simulated driver (`cargo build -p wp-tests --tests`).
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; shift || true
BINS=("$@"); [ ${#BINS[@]} -gt 0 ] || BINS=(target/release/wedgeprobe)
LIB=$(ls -d target/debug/build/wp-tests-*/out/simcuda/libcuda.so.1 2>/dev/null | head -1)
[ -e "$LIB" ] || { echo "no simulated libcuda: cargo build -p wp-tests --tests" >&2; exit 2; }
OUT=$(mktemp -d)
gcc -O2 -o "$OUT/yield_loop" scripts/yield_loop.c
for r in $(seq 1 "$ROUNDS"); do
  for side in none "${BINS[@]}"; do
    LD_PRELOAD=$LIB "$OUT/yield_loop" 6 200000 2 > "$OUT/y" & P=$!
    W=""
    if [ "$side" != none ]; then "$side" watch --pid $P > /dev/null 2>&1 & W=$!; fi
    wait $P
    if [ -n "$W" ]; then kill -INT $W 2>/dev/null || true; wait $W 2>/dev/null || true; fi
    echo "round $r, $side: $(tail -4 "$OUT/y" | sort -n | tr '\n' ' ')"
  done
done
rm -rf "$OUT"
