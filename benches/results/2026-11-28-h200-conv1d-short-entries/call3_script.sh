#!/bin/bash
# stop 22 call 3: short walks with every row load issued before any conversion (wheel-sl) vs main 2ddcc1a's short kernels (wheel-next2)
for w in next2 sl; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== sl conv tests" | tee $OUT/d3.txt
run sl 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_sl.txt 2>&1; echo "rc $?" >> $OUT/tests_sl.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_sl.txt | head -20 | tee -a $OUT/d3.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/d3.txt
for w in next2 sl next2 sl; do run $w 60 python3 tools/conv1d_profile.py $w --shape 32 640 60 2>&1 | grep " cl:"; run $w 60 python3 tools/conv1d_profile.py $w --shape 1 640 60 2>&1 | grep " cl:"; done | tee -a $OUT/d3.txt
run sl 60 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section InstructionStats --kernel-name regex:^causal_conv1d_fwd_cl_short --launch-skip 2 --launch-count 1 python3 tools/conv1d_profile.py sl --shape 32 640 60 > $OUT/ncu_fwd_short_sl.txt 2>&1
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued" $OUT/ncu_fwd_short_sl.txt | tee -a $OUT/d3.txt
for t in memcheck racecheck; do echo "== $t sl ($((SECONDS-T0)) s)" | tee -a $OUT/d3.txt; run sl 170 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/d3.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/d3.txt
