#!/bin/bash
# stop 23 call 5: ssd_bwd_prologue on the 8-head CTAs (p3 = prep-v3 4484eec) against main's kernels (p2 = 7cd1623, the code of 3b3e514 / af6b6ab)
for w in p2 p3; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== p3: ssd tests" | tee $OUT/c5.txt
run p3 150 python3 -m pytest -q tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $OUT/tests_p3_ssd.txt 2>&1; echo "rc $?" >> $OUT/tests_p3_ssd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_p3_ssd.txt | head | tee -a $OUT/c5.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/c5.txt
for w in p2 p3 p2 p3; do echo "-- $w"; run $w 45 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 2>&1 | grep -E "^## SSD|prologue|prep"; done | tee -a $OUT/c5.txt
for t in memcheck racecheck; do echo "== $t p3 ($((SECONDS-T0)) s)" | tee -a $OUT/c5.txt; run p3 60 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/c5.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/c5.txt
