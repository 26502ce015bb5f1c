#!/bin/bash
# stop 30 call 6 (the last ~320 s of device time): f1 = c34b19f (6b6f2ae's kernels), f2 = f1 + store_dd's
# reduce-scatter (14 shuffles a thread instead of 48; dx16's epilogue, ~9% of its stall samples).
# Predicted dx16 507 -> ~500 us. The backward GPU tests (test_backward*) and memcheck / racecheck on f2.
R=$(pwd); O=$OUT/s30f; mkdir -p $O
for w in f1 f2; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t30; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s30f.tgz s30f && rm -rf s30f; }
trap fin EXIT
ab() { for w in f1 f2; do
  echo "-- $w r$1"
  run $w 70 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|dx16" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== f2 backward tests ($((SECONDS-T0)) s)" >> $S
run f2 80 python3 -m pytest -q $T/tests/test_ssd_gpu.py -k "backward or kept_states or compiled_training" -m gpu -n 8 -p no:cacheprovider > $O/tests_bwd_f2.txt 2>&1; echo "rc $?" >> $O/tests_bwd_f2.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_bwd_f2.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
for t in memcheck racecheck; do echo "== $t f2 ($((SECONDS-T0)) s)" >> $S; run f2 35 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
