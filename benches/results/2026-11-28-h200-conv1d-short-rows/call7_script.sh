#!/bin/bash
# stop 21 call 7: the decode update in 32-bit indices: A/B vs the head, the conv tests, memcheck
for w in head upd; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== A/B" | tee $OUT/s7.txt
for w in head upd head upd; do run $w 60 python3 benches/results/2026-11-28-h200-conv1d-short-rows/upd_ab.py $w 2>&1 | grep -v -i warn; done | tee -a $OUT/s7.txt
echo "== tests upd ($((SECONDS-T0)) s)" | tee -a $OUT/s7.txt
run upd 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_upd.txt 2>&1; echo "rc $?" >> $OUT/tests_upd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_upd.txt | head -20 | tee -a $OUT/s7.txt
echo "== memcheck upd ($((SECONDS-T0)) s)" | tee -a $OUT/s7.txt; run upd 140 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/memcheck.txt 2>&1; echo "rc $?" >> $OUT/memcheck.txt; grep -v "^========= *$" $OUT/memcheck.txt | tail -3 | tee -a $OUT/s7.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/s7.txt
