#!/bin/bash
# stop 24, call 3: keep2 (the kept-states branch with the template / hoisted fixes and the scratch
# pool not made under capture) beside main (c5438b4). Logs go into one tarball (the tool returns 8 files).
for w in head keep2; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=${TMPDIR}/logs; mkdir -p $L
S=$OUT/summary.txt
for w in head keep2; do
  echo "== $w: test_first_scratch_use_inside_a_capture" | tee -a $S
  run $w 120 python3 -m pytest -q tests/test_ssd_gpu.py -k first_scratch -p no:cacheprovider > $L/first_$w.txt 2>&1; echo "rc $?" >> $L/first_$w.txt
  grep -E "Error|passed|failed|^rc" $L/first_$w.txt | tail -4 | tee -a $S
done
echo "== keep2: ssd tests ($((SECONDS-T0)) s)" | tee -a $S
run keep2 220 python3 -m pytest -q tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd.txt 2>&1; echo "rc $?" >> $L/tests_ssd.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd.txt | head -30 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
for r in 1 2; do
  for m in head keep20 keep21; do
    w=${m%[01]}; k=${m#keep2}; [ "$m" = head ] && k=1
    echo "-- $m"
    run $w 60 env FLASHSCAN_SSD_KEEP_STATES=$k python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_${m}_$r.txt 2>&1
    grep -E "^## SSD|chunk_state|state_passing|chunk_prep|bwd_dt|dx16" $L/prof_${m}_$r.txt
  done
done | tee -a $S
for t in memcheck racecheck; do echo "== $t keep2 ($((SECONDS-T0)) s)" | tee -a $S; run keep2 90 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $L/$t.txt 2>&1; echo "rc $?" >> $L/$t.txt; grep -v "^========= *$" $L/$t.txt | tail -3 | tee -a $S; done
echo "== kept_seeds ($((SECONDS-T0)) s)" | tee -a $S
run keep2 100 python3 benches/results/2026-11-28-h200-ssd-kept-states/kept_seeds.py > $L/kept_seeds.txt 2>&1; echo "rc $?" >> $L/kept_seeds.txt
head -3 $L/kept_seeds.txt | tee -a $S; tail -3 $L/kept_seeds.txt | tee -a $S
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
