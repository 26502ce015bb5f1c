#!/bin/bash
# stop 22 call 2: prep/conv-next db8c404 (wheel-next2: cl short walks as their own entries): conv tests, A/B vs head at both shapes, peer rows, bench quick, memcheck / racecheck, ncu of the short kernels
for w in head next2; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
cp .dev/tests-next/test_conv_gpu.py tests/; cp .dev/tests-next/sanitize_cases.py tools/
echo "== next2 conv tests" | tee $OUT/d2.txt
run next2 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_next2.txt 2>&1; echo "rc $?" >> $OUT/tests_next2.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_next2.txt | head -20 | tee -a $OUT/d2.txt
P="--peer .peers/causal-conv1d .dev/peer-cc"
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/d2.txt
for w in head next2 head next2; do run $w 60 python3 tools/conv1d_profile.py $w --shape 32 640 60 2>&1 | grep " cl:"; done | tee -a $OUT/d2.txt
for w in head next2; do run $w 60 python3 tools/conv1d_profile.py $w --shape 1 640 60 2>&1 | grep " cl:"; done | tee -a $OUT/d2.txt
run next2 60 python3 tools/conv1d_profile.py next2 2>&1 | grep " cf:\| cl:" | tee -a $OUT/d2.txt
run next2 60 python3 tools/conv1d_profile.py next2 $P --shape 32 640 60 2>&1 | grep " cf:\| cl:" | tee -a $OUT/d2.txt
echo "== bench ($((SECONDS-T0)) s)" | tee -a $OUT/d2.txt
run next2 120 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench > $OUT/bench.log 2>&1; tail -3 $OUT/bench.log | tee -a $OUT/d2.txt
for k in causal_conv1d_fwd_cl_short causal_conv1d_bwd_cl_short; do
  run next2 60 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section InstructionStats --kernel-name regex:^$k --launch-skip 2 --launch-count 1 python3 tools/conv1d_profile.py next2 --shape 32 640 60 > $OUT/ncu_$k.txt 2>&1
  grep -E "Duration|Registers Per|Achieved Occ|Executed Instructions  " $OUT/ncu_$k.txt | tee -a $OUT/d2.txt
done
for t in memcheck racecheck; do echo "== $t next2 ($((SECONDS-T0)) s)" | tee -a $OUT/d2.txt; run next2 170 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/d2.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/d2.txt
