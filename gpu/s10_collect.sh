#!/usr/bin/env bash
# Waits for gpu/s10_final_b.sh's healthy run to end (at most $1 s), then prints its summary.
#   bash gpu/s10_collect.sh SECONDS OUT
set -u
WAIT=${1:-560}; OUT=${2:?out dir}; mkdir -p "$OUT"
for _ in $(seq 1 "$WAIT"); do [ -e /tmp/healthy/done ] && break; sleep 1; done
echo "healthy run: $(( $(date +%s) - $(cat /tmp/healthy/started) )) s since it started; done: $([ -e /tmp/healthy/done ] && echo yes || echo no)"
cat /tmp/healthy/summary.txt
cp /tmp/healthy/daemon.log "$OUT/healthy-daemon.log" 2>/dev/null
cp /tmp/healthy/metrics.txt "$OUT/healthy-metrics.txt" 2>/dev/null
tail -3 /tmp/healthy/loop.out 2>/dev/null
