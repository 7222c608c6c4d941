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
# A launch's share is the difference between runs of 2N and N launches over N: what the shim
# does once (installing its hooks decodes libcuda's entry points with iced-x86 since 3754fb2:
# ~2.8 million instructions a process on 067c017) is not a launch's cost, and a single run's
# average counted it (1,487 "a launch" at N = 5,000 on 067c017; 923 by the difference).
set -eu
cd "$(dirname "$0")/.."
SHIM=$(realpath "${1:-target/release/libcupti_shim.so}")
LINES=${2:-}
D=$(ls -d target/release/build/wp-tests-*/out/simcuda 2>/dev/null | head -1)
[ -x "$D/simworker" ] || { echo "no release simworker: cargo build --release -p wp-tests" >&2; exit 2; }
OUT=$(mktemp -d)
N=5000
for n in $N $((2 * N)); do
  mkdir -p "$OUT/$n"
  SIMWORKER_POLLUTE_KB=512 WEDGEPROBE_SHIM_MARK_US=60000000 CUDA_INJECTION64_PATH=$SHIM \
    LD_LIBRARY_PATH=$D valgrind --tool=callgrind --smc-check=all \
    --callgrind-out-file="$OUT/$n/cg.%p" --dump-instr=yes --dump-line=no --compress-pos=no \
    --compress-strings=no --cache-sim=yes --D1=32768,8,64 --I1=32768,8,64 --LL=262144,16,64 \
    --separate-threads=yes "$D/simworker" bench $n > "$OUT/$n/log" 2>&1
done
python3 - "$(ls "$OUT"/$N/cg.*-01)" "$(ls "$OUT"/$((2 * N))/cg.*-01)" "$(basename "$SHIM")" $N "$LINES" <<'PY'
import collections, sys
one, two, obj_key, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lines, functions = sys.argv[5] == "--lines", sys.argv[5] == "--functions"

def costs(path):
    """Self cost in the shim: instructions, data misses by (address, function), instructions by function."""
    obj = fn = None; call_cost = False; ir = 0
    misses = collections.Counter(); by_fn = collections.Counter()
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
    return ir, misses, by_fn

(ir1, m1, f1), (ir2, m2, f2) = costs(one), costs(two)
misses = m2.copy(); misses.subtract(m1)
by_fn = f2.copy(); by_fn.subtract(f1)
print(f"{obj_key}: {sum(misses.values()) / n:.1f} data misses and {(ir2 - ir1) / n:.0f} instructions "
      f"a launch in the shim (runs of {2 * n} and {n} launches; once a process: {(2 * ir1 - ir2) / 1000:.0f}k)")
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
