#!/bin/bash
# stop 21 call 3: short-sequence conv1d paths (cl rows per warp, cf rows per block, fwd_cf without seq_idx
# as its own entry): tests, sanitizers, A/B at the big shape, the bench's real-time rows
for w in head rows; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== tests rows" | tee $OUT/s3.txt
run rows 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_rows.txt 2>&1; echo "rc $?" >> $OUT/tests_rows.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_rows.txt | head -20 | tee -a $OUT/s3.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/s3.txt
for w in head rows head rows; do run $w 60 python3 tools/conv1d_profile.py $w 2>&1 | grep -v -i warn; done > $OUT/ab.txt
grep " cf:\| cl:" $OUT/ab.txt | tee -a $OUT/s3.txt
echo "== bench rows ($((SECONDS-T0)) s)" | tee -a $OUT/s3.txt
run rows 150 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench_rows > $OUT/bench_rows.log 2>&1; echo "rc $?" | tee -a $OUT/s3.txt
grep -E "realtime|update|2k" $OUT/bench_rows.log | tee -a $OUT/s3.txt
for t in memcheck racecheck; do echo "== $t rows ($((SECONDS-T0)) s)" | tee -a $OUT/s3.txt; run rows 140 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/s3.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/s3.txt
