#!/usr/bin/env bash
# Session 10, second part: the 10-minute healthy serving run under the daemon starts in the
# background (its own session: it outlives this command; gpu/s10_collect.sh reads it), then,
# beside it, issue 15's attach check and issue 12's naming shapes with the final build.
#   bash gpu/s10_final_b.sh OUT
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
# Binaries in a root-owned directory: `attach` refuses a shim someone else could replace.
install -d -m 755 /opt/wp-s10 && install -m 755 "${NEW:-$PWD/.bench/s10}"/* /opt/wp-s10/
export NEW=/opt/wp-s10
rm -rf /tmp/healthy; mkdir -p /tmp/healthy
# On cores 10-15 (what runs beside it takes 2-9).
setsid nohup taskset -c 10-15 bash -c "NEW=$NEW bash gpu/healthy_serving.sh /tmp/healthy 600 > /tmp/healthy/summary.txt 2>&1; touch /tmp/healthy/done" > /dev/null 2>&1 &
date +%s > /tmp/healthy/started
echo "=== healthy run started in the background at $(date -u +%T)"
sleep 2
echo "=== issue 15: attach"
bash gpu/attach_check.sh "$OUT/attach" 2>&1
echo "=== issue 12: the naming shapes (gpu/marks_check.sh), final build"
WP=$NEW/wedgeprobe timeout 330 bash gpu/marks_check.sh "$OUT/marks" 2>&1 | grep -vE "^\s*$" | cut -c1-420
