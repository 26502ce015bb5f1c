#!/bin/bash
# stop 21 call 6: the decode update's register path: A/B of the kernel vs the head, tests, sanitizers, ncu
for w in head upd; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== A/B" | tee $OUT/s6.txt
for w in head upd head upd; do run $w 60 python3 benches/results/2026-11-28-h200-conv1d-short-rows/upd_ab.py $w 2>&1 | grep -v -i warn; done | tee -a $OUT/s6.txt
echo "== tests upd ($((SECONDS-T0)) s)" | tee -a $OUT/s6.txt
run upd 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_upd.txt 2>&1; echo "rc $?" >> $OUT/tests_upd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_upd.txt | head -20 | tee -a $OUT/s6.txt
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis"
for w in head upd; do
  run $w 60 ncu --clock-control none --kernel-name causal_conv1d_update --launch-skip 60 --launch-count 1 $S python3 benches/results/2026-11-28-h200-conv1d-short-rows/upd_ab.py $w > $OUT/ncu_update_$w.txt 2>&1
  echo "== ncu $w ($((SECONDS-T0)) s)" | tee -a $OUT/s6.txt; grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|DRAM Throughput|Warp Cycles Per Issued" $OUT/ncu_update_$w.txt | head -8 | tee -a $OUT/s6.txt
done
for t in memcheck racecheck; do echo "== $t upd ($((SECONDS-T0)) s)" | tee -a $OUT/s6.txt; run upd 140 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/s6.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/s6.txt
