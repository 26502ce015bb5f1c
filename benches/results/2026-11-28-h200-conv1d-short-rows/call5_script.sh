#!/bin/bash
# stop 21 call 5: the staged decode update (tests, sanitizers, bench); ncu of the real-time channel-last
# kernels beside causal-conv1d's
for w in head upd; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== tests upd" | tee $OUT/s5.txt
run upd 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_upd.txt 2>&1; echo "rc $?" >> $OUT/tests_upd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_upd.txt | head -20 | tee -a $OUT/s5.txt
echo "== bench upd ($((SECONDS-T0)) s)" | tee -a $OUT/s5.txt
run upd 150 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench_upd > $OUT/bench_upd.log 2>&1; echo "rc $?" | tee -a $OUT/s5.txt
grep -E "realtime|update|2k" $OUT/bench_upd.log | tee -a $OUT/s5.txt
echo "== rt profile ($((SECONDS-T0)) s)" | tee -a $OUT/s5.txt
P="--peer .peers/causal-conv1d .dev/peer-cc"
run upd 90 python3 tools/conv1d_profile.py upd $P --shape 32 640 60 2>&1 | grep -v -i warn | tee -a $OUT/s5.txt
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis"
for k in causal_conv1d_fwd_cl causal_conv1d_channellast_fwd_kernel causal_conv1d_bwd_cl causal_conv1d_channellast_bwd_kernel; do
  run upd 60 ncu --clock-control none --kernel-name regex:"^$k" --launch-skip 2 --launch-count 1 $S python3 tools/conv1d_profile.py ncu $P --shape 32 640 60 > $OUT/ncu_rt_$k.txt 2>&1
  echo "== $k ($((SECONDS-T0)) s)" | tee -a $OUT/s5.txt; grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Instructions  |Waves Per SM|Grid Size" $OUT/ncu_rt_$k.txt | head -10 | tee -a $OUT/s5.txt
done
for t in memcheck racecheck synccheck; do echo "== $t upd ($((SECONDS-T0)) s)" | tee -a $OUT/s5.txt; run upd 140 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/s5.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/s5.txt
