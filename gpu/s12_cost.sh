#!/usr/bin/env bash
# Issue 12, session 12: the launch record's share of the eager cost, and whether prefetching
# a launch's journal lines at the hook's entry lowers it. Shim + daemon, recording switched on
# and off between neighbouring decode steps inside one process (gpu/step_ab.py); each variant
# one process, the daemon started first. Builds in $NEW/<variant>/libcupti_shim.so:
#   base     session 11's shim
#   pf       the lines a launch writes (ring record, in-flight slot, thread slot), predicted by
#            the thread's previous launch, prefetched for writing at the hook's entry; the
#            record mode mirrored in process memory
#   noring   pf without the ring record (a measurement build, not a product: the flight
#            recorder then has no launches), to price the ring record alone
# "marks off": WEDGEPROBE_SHIM_MARK_EVERY=1048576 WEDGEPROBE_SHIM_MARK_US=60000000 (only the
# marks after a synchronize are left), to price the recording without its marks.
#   bash gpu/s12_cost.sh OUT      (binaries: $NEW, default .bench/s12)
set -u
OUT=${1:?out dir}; mkdir -p "$OUT"
SRC=${NEW:-$PWD/.bench/s12}
for v in base pf noring; do install -d -m 755 /opt/wp-s12/$v && install -m 755 "$SRC/$v/libcupti_shim.so" /opt/wp-s12/$v/; done
install -m 755 "$SRC/wedgeprobe" /opt/wp-s12/
NEW=/opt/wp-s12
. gpu/cost_ab.sh
cost_ab_start "$OUT" "$NEW/wedgeprobe"
OFF=$COST_AB_OFF
cost_ab base $NEW/base X=1
cost_ab pf $NEW/pf X=1
cost_ab base-marks-off $NEW/base $OFF
cost_ab pf-marks-off $NEW/pf $OFF
cost_ab noring-marks-off $NEW/noring $OFF
cost_ab pf-events $NEW/pf WEDGEPROBE_SHIM_MARK_WITH=event
cost_ab pf-again $NEW/pf X=1
cost_ab base-again $NEW/base X=1
cost_ab_stop
for b in pf base; do
  echo "=== self_cost, eager decode, $b"
  CUDA_INJECTION64_PATH=$NEW/$b/libcupti_shim.so WEDGEPROBE_SHIM_MEASURE=self_cost \
    taskset -c 2-9 timeout 100 python3 gpu/self_cost.py 3 2>&1 | grep -E "self cost|generations|rror" | head -4 | cut -c1-700
done
