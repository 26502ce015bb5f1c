#!/bin/bash
# stop 31 call 2: a = ssd2_chunk_state / ssd2_varlen_states on wgmma (B in swizzled stages, one
# m64n128k16 a k16 step for the warpgroup instead of 16 mma.sync a warp, one barrier a step);
# b = a + __launch_bounds__(128, 5) (96 registers, 16 bytes of stack). Predicted chunk_state 143 ->
# ~115 us (L1 traffic of B 4x less; L2 at 76% stays). SSD GPU tests + memcheck / racecheck on a.
R=$(pwd); O=$OUT/s31b; mkdir -p $O
for w in m a b; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s31b.tgz s31b && rm -rf s31b; }
trap fin EXIT
ab() { for w in m a b; do
  echo "-- $w r$1"
  run $w 80 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|state_passing" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== a ssd tests ($((SECONDS-T0)) s)" >> $S
run a 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_a.txt 2>&1; echo "rc $?" >> $O/tests_ssd_a.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_a.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
for t in memcheck racecheck; do echo "== $t a ($((SECONDS-T0)) s)" >> $S; run a 40 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
