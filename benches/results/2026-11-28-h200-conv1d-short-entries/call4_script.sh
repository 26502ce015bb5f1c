#!/bin/bash
# stop 22 call 4: ssd2_chunk_state with three cp.async stages on sm_90 (wheel-st3) vs main's two (wheel-next2: same SSD code as main)
for w in next2 st3; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== st3 ssd tests" | tee $OUT/d4.txt
run st3 200 python3 -m pytest -q tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $OUT/tests_st3.txt 2>&1; echo "rc $?" >> $OUT/tests_st3.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_st3.txt | head -20 | tee -a $OUT/d4.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/d4.txt
for w in next2 st3 next2 st3; do echo "-- $w"; run $w 90 python3 tools/ssd_profile.py --shape 2k --reps 4 2>&1 | grep -E "^## |ssd2_chunk_state|ssd2_chunk_scan\`|state_passing\`|dstate16"; done | tee -a $OUT/d4.txt
echo "== peer ($((SECONDS-T0)) s)" | tee -a $OUT/d4.txt
run st3 120 python3 tools/ssd_profile.py --shape 2k --reps 4 --fwd-only --mamba-src .peers/mamba > $OUT/ssd_fwd_2k_st3_peer.txt 2>&1; grep -E "^## " $OUT/ssd_fwd_2k_st3_peer.txt | tee -a $OUT/d4.txt
for t in memcheck racecheck; do echo "== $t st3 ($((SECONDS-T0)) s)" | tee -a $OUT/d4.txt; run st3 150 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd_fwd2 > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/d4.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/d4.txt
