#!/usr/bin/env bash
# Where the daemon's CPU goes with 8 PyTorch processes on the H200: per-tick phase times
# (WEDGEPROBE_DEBUG_TICK) and a perf profile. The GPU machine has no perf: bring the
# development machine's with its libraries, built there with:
#   mkdir -p target/perfkit/lib && cp /usr/bin/perf target/perfkit/ && for l in $(ldd /usr/bin/perf \
#     | awk '{print $3}' | grep / | grep -v -e libc.so -e libm.so -e ld-linux); do cp -L $l target/perfkit/lib/; done
# and carried with the binaries (debug sections compressed to fit: objcopy --compress-debug-sections).
#   bash gpu/profile_daemon.sh OUT
set -u
OUT=${1:-/tmp/wpprof}; mkdir -p "$OUT"
WP=${WP:-$PWD/target/release/wedgeprobe}
SHIM=$(dirname "$WP")/libcupti_shim.so
KIT=$PWD/target/perfkit
for i in $(seq 1 8); do
  CUDA_INJECTION64_PATH=$SHIM python3 gpu/torch_bench.py 40 > /dev/null 2>&1 &
done
sleep 8
printf 'listen = "127.0.0.1:19464"\ndump_dir = "%s/dumps"\n' "$OUT" > /tmp/wpd.toml
WEDGEPROBE_DEBUG_TICK=1 "$WP" daemon --config /tmp/wpd.toml 2> "$OUT/daemon.log" & D=$!
sleep 12
read -r u0 s0 < <(awk '{print $14, $15}' /proc/$D/stat)
LD_LIBRARY_PATH=$KIT/lib $KIT/perf record -e cpu-clock -F 999 --call-graph dwarf,16384 \
  -o "$OUT/perf.data" -p $D -- sleep 12 > "$OUT/perf-record.log" 2>&1
read -r u1 s1 < <(awk '{print $14, $15}' /proc/$D/stat)
echo "daemon CPU over the 12 s profiled: $(( u1+s1-u0-s0 ))/1200 ticks"
kill -INT $D; wait $D 2>/dev/null
pkill -f torch_bench.py; wait 2>/dev/null
tail -2 "$OUT/perf-record.log"
grep "per tick" "$OUT/daemon.log" | tail -2
LD_LIBRARY_PATH=$KIT/lib $KIT/perf report -i "$OUT/perf.data" --children --percent-limit 1.5 \
  --stdio -g none 2>/dev/null | grep "%" | grep -v "\[k\]" | head -70 > "$OUT/report.txt"
LD_LIBRARY_PATH=$KIT/lib $KIT/perf report -i "$OUT/perf.data" --no-children --percent-limit 1 \
  --stdio -g none 2>/dev/null | grep "%" | head -40 > "$OUT/self.txt"
cat "$OUT/report.txt" | cut -c1-160; echo "--- self"; cut -c1-160 "$OUT/self.txt"
rm -f "$OUT/perf.data"
