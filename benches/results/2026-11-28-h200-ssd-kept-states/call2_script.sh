#!/bin/bash
# stop 24, call 2: the kept-states branch (5807588) beside main (c5438b4): SSD GPU tests, A/B of
# the forward+backward (head; keep with FLASHSCAN_SSD_KEEP_STATES=0; keep default), sanitizers, and
# the accuracy of the df sums over seeds (kept vs recompute).
for w in head keep; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
S=$OUT/summary.txt
echo "== keep: ssd tests" | tee $S
run keep 200 python3 -m pytest -q tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $OUT/tests_keep_ssd.txt 2>&1; echo "rc $?" >> $OUT/tests_keep_ssd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_keep_ssd.txt | head -20 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
for r in 1 2; do
  for m in head keep0 keep1; do
    w=${m%[01]}; k=${m#keep}; [ "$m" = head ] && k=1
    echo "-- $m"
    run $w 60 env FLASHSCAN_SSD_KEEP_STATES=$k python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $OUT/prof_${m}_$r.txt 2>&1
    grep -E "^## SSD|chunk_state|state_passing|chunk_prep|bwd_dt|dx16" $OUT/prof_${m}_$r.txt
  done
done | tee -a $S
for t in memcheck racecheck; do echo "== $t keep ($((SECONDS-T0)) s)" | tee -a $S; run keep 90 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $S; done
echo "== kept_seeds ($((SECONDS-T0)) s)" | tee -a $S
run keep 100 python3 benches/results/2026-11-28-h200-ssd-kept-states/kept_seeds.py > $OUT/kept_seeds.txt 2>&1; echo "rc $?" >> $OUT/kept_seeds.txt
tail -4 $OUT/kept_seeds.txt | tee -a $S
echo "done ($((SECONDS-T0)) s)" | tee -a $S
