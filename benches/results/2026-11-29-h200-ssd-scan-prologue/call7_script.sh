#!/bin/bash
# stop 32 call 7: f = e (97253ab's kernels) + store_state_tile's whole tiles stored without per-element
# checks (ncu, call 6: ~20% of ssd2_chunk_state's stall samples in that store's tests and branches;
# predicted chunk_state and dstate16 -5..10%). A/B e / f twice, SSD GPU tests + memcheck on f.
R=$(pwd); O=$OUT/s32g; mkdir -p $O
for w in e f; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32g.tgz s32g && rm -rf s32g; }
trap fin EXIT
ab() { for w in $2; do
  echo "-- $w r$1"
  run $w 60 python3 $T/tools/ssd_profile.py --shape 2k --reps 3 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|dstate16" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 "e f" >> $S 2>&1
echo "== f ssd tests ($((SECONDS-T0)) s)" >> $S
run f 120 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_f.txt 2>&1; echo "rc $?" >> $O/tests_ssd_f.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_f.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 "f e" >> $S 2>&1
echo "== memcheck f ($((SECONDS-T0)) s)" >> $S; run f 40 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/memcheck.txt 2>&1; echo "rc $?" >> $O/memcheck.txt; grep -v "^========= *$" $O/memcheck.txt | tail -3 >> $S
