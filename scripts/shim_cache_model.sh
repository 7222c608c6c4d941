#!/usr/bin/env bash
# The shim's cold cache lines per hooked launch, in callgrind's cache model of a serving loop
# (BENCHMARKS.md, the recorder's price, 2026-12-02): the simulated driver's launch loop with 512 KiB of
# memory churned between launches (`SIMWORKER_POLLUTE_KB`, the stack kept warm), gap marks off
# (under valgrind's slowness every launch would follow an idle gap and be marked). Prints the
# data misses and instructions a launch that fall in the shim's own code, and with --lines the
# instructions that missed (addresses in the shim; map them with `objdump -d`), with --functions
# the instructions a launch by function (self cost: where the shim's instructions go).
#   scripts/shim_cache_model.sh [SHIM.so] [--lines|--functions]    (default: target/release/libcupti_shim.so)
# Needs valgrind and a release build (`cargo build --release -p cupti-shim -p wp-tests`).
set -eu
cd "$(dirname "$0")/.."
SHIM=$(realpath "${1:-target/release/libcupti_shim.so}")
LINES=${2:-}
D=$(ls -d target/release/build/wp-tests-*/out/simcuda 2>/dev/null | head -1)
[ -x "$D/simworker" ] || { echo "no release simworker: cargo build --release -p wp-tests" >&2; exit 2; }
OUT=$(mktemp -d)
N=5000
SIMWORKER_POLLUTE_KB=512 WEDGEPROBE_SHIM_MARK_US=60000000 CUDA_INJECTION64_PATH=$SHIM \
  LD_LIBRARY_PATH=$D valgrind --tool=callgrind --smc-check=all \
  --callgrind-out-file="$OUT/cg.%p" --dump-instr=yes --dump-line=no --compress-pos=no \
  --compress-strings=no --cache-sim=yes --D1=32768,8,64 --I1=32768,8,64 --LL=262144,16,64 \
  --separate-threads=yes "$D/simworker" bench $N > "$OUT/log" 2>&1
python3 - "$(ls "$OUT"/cg.*-01)" "$(basename "$SHIM")" $N "$LINES" <<'PY'
import collections, sys
path, obj_key, n, lines = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "--lines"
functions = sys.argv[4] == "--functions"
obj = fn = None; call_cost = False; ir = 0; misses = collections.Counter(); by_fn = collections.Counter()
for line in open(path):
    line = line.rstrip("\n")
    if line.startswith("ob="): obj = line[3:]; continue
    if line.startswith("fn="): fn = line[3:]; call_cost = False; continue
    if line.startswith(("cob=", "cfn=")): continue
    if line.startswith("calls="): call_cost = True; continue
    if line.startswith("0x"):
        if call_cost: call_cost = False; continue   # a callee's inclusive cost
        p = line.split(); v = [int(x) for x in p[1:]] + [0] * 9
        if obj and obj_key in obj:
            ir += v[0]; misses[(p[0], fn)] += v[4] + v[5]   # D1mr + D1mw
            by_fn[fn] += v[0]
print(f"{obj_key}: {sum(misses.values()) / n:.1f} data misses and {ir / n:.0f} instructions a launch in the shim")
if functions:
    for f, i in by_fn.most_common(25):
        if i >= n * 2:
            print(f"  {i / n:7.1f}  {f[:100]}")
if lines:
    for (a, f), m in sorted(misses.items()):
        if m >= n * 0.3:
            print(f"  {m / n:5.2f}  {a}  {f[:70]}")
PY
rm -rf "$OUT"
