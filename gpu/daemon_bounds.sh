#!/usr/bin/env bash
# Issue 5 on the GPU machine: the daemon's own CPU and memory with 8 PyTorch processes (shim,
# launch-bound loops) sharing the H200.
#   [EXTRA='tick = "250ms"'] bash gpu/daemon_bounds.sh OUT   (EXTRA: more config lines)
set -u
OUT=${1:-/tmp/wpdb}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing
echo "=== daemon cost with 8 PyTorch processes (shim) on the GPU"
for i in $(seq 1 8); do
  CUDA_INJECTION64_PATH=$SHIM python3 gpu/torch_bench.py 40 > /dev/null 2>&1 &
done
sleep 8
printf 'listen = "127.0.0.1:19464"\ndump_dir = "%s/dumps"\n%b\n' "$OUT" "${EXTRA:-}" > /tmp/wpd.toml
echo "config: $(tr '\n' ' ' < /tmp/wpd.toml)"
"$WP" daemon --config /tmp/wpd.toml 2> "$OUT/daemon.log" & D=$!
sleep 12
read -r u0 s0 < <(awk '{print $14, $15}' /proc/$D/stat)
sleep 30
read -r u1 s1 < <(awk '{print $14, $15}' /proc/$D/stat)
rss=$(awk '/VmRSS/ {print $2}' /proc/$D/status)
echo "daemon memory: $(grep -E 'RssAnon|RssFile|RssShmem' /proc/$D/status | tr -s ' \t' ' ' | tr '\n' ' ')"
targets=$(curl -s 127.0.0.1:19464/metrics | grep -c '^wedgeprobe_target_info')
echo "daemon: targets $targets, CPU $(( (u1+s1-u0-s0) ))/3000 ticks = $(python3 -c "print(round(($u1+$s1-$u0-$s0)/30.0, 2))")% of one core over 30 s, RSS ${rss} kB"
kill -INT $D; wait $D 2>/dev/null
pkill -f torch_bench.py; wait 2>/dev/null
head -12 "$OUT/daemon.log"
