#!/bin/bash
# stop 32 call 2: a = ssd2_chunk_state with two heads of a group a CTA (two warpgroups sharing each B
# stage: B's L2 traffic halved; predicted chunk_state 119 -> ~95 us, the backward's recompute alike);
# b = a + the scan's prologue in 32-bit and load_prep unrolled (predicted scan -2..3%). A/B r/a/b two
# alternations (forward+backward profile), SSD GPU tests + memcheck / racecheck on b.
R=$(pwd); O=$OUT/s32b; mkdir -p $O
for w in r a b; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32b.tgz s32b && rm -rf s32b; }
trap fin EXIT
ab() { for w in $2; do
  echo "-- $w r$1"
  run $w 100 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|chunk_scan|dstate16|state_passing" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 "r a b" >> $S 2>&1
echo "== b ssd tests ($((SECONDS-T0)) s)" >> $S
run b 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_b.txt 2>&1; echo "rc $?" >> $O/tests_ssd_b.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_b.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 "b a r" >> $S 2>&1
for t in memcheck racecheck; do echo "== $t b ($((SECONDS-T0)) s)" >> $S; run b 70 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
