#!/bin/bash
# stop 23 call 4: ssd2_chunk_prep with dt read 8 heads a CTA (p2 = prep-v2 7cd1623) against main (head = 4188547)
for w in head p2; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== p2: ssd tests" | tee $OUT/c4.txt
run p2 200 python3 -m pytest -q tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $OUT/tests_p2_ssd.txt 2>&1; echo "rc $?" >> $OUT/tests_p2_ssd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_p2_ssd.txt | head | tee -a $OUT/c4.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/c4.txt
for w in head p2 head p2; do echo "-- $w"; run $w 90 python3 tools/ssd_profile.py --shape 2k --reps 4 2>&1 | grep -E "^## SSD forward.*=2|^## SSD forward\+backward.*BWD=2|prep"; run $w 60 python3 tools/ssd_profile.py --shape rt --reps 4 --fwd-only 2>&1 | grep -E "^## SSD forward.*FWD=2"; done | tee -a $OUT/c4.txt
echo "== p2 with Triton ($((SECONDS-T0)) s)" | tee -a $OUT/c4.txt
run p2 150 python3 tools/ssd_profile.py --shape 2k --reps 4 --fwd-only --mamba-src .peers/mamba > $OUT/ssd_2k_p2_triton.txt 2>&1; grep -E "^## |prep|cumsum" $OUT/ssd_2k_p2_triton.txt | tee -a $OUT/c4.txt
for t in memcheck racecheck; do echo "== $t p2 ($((SECONDS-T0)) s)" | tee -a $OUT/c4.txt; run p2 150 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd_fwd2 ssd > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/c4.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/c4.txt
