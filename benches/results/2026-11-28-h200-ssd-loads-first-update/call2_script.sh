#!/bin/bash
# stop 23 call 2: update A/B (head = main d8f2391, land = + the four measured prep commits, ring = + the ring store from registers);
# then the whole GPU suite on ring with sanitizers (memcheck / racecheck over ssd ssd_fwd2 conv) beside it
for w in head land ring; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== update A/B" | tee $OUT/c2.txt
for w in head land ring head land ring; do run $w 60 python3 benches/results/2026-11-28-h200-conv1d-short-rows/upd_ab.py $w 2>&1 | grep -v -i warn; done | tee -a $OUT/c2.txt
echo "== suite on ring + sanitizers ($((SECONDS-T0)) s)" | tee -a $OUT/c2.txt
cp .dev/tests-next/test_ssd_gpu.py tests/
(cd /tmp && run ring 420 python3 -m pytest $R/tests -m gpu -n 8 -q -p no:cacheprovider > $OUT/suite_ring.txt 2>&1; echo "rc $?" >> $OUT/suite_ring.txt) &
for t in memcheck racecheck; do run ring 200 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 conv > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; echo "-- $t ($((SECONDS-T0)) s)"; grep -v "^========= *$" $OUT/$t.txt | tail -3; done | tee -a $OUT/c2.txt
wait
echo "-- suite ($((SECONDS-T0)) s)" | tee -a $OUT/c2.txt
grep -E "FAILED|ERROR|passed|failed|^rc" $OUT/suite_ring.txt | tail -15 | tee -a $OUT/c2.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/c2.txt
