#!/bin/bash
# stop 31 call 6 (the last ~290 s): f = d + ssd_bwd_chunk_dx16's W^T g on wgmma (g tiles swizzled,
# W^T from registers, g the MN-major B; the state term stays on mma.sync). Predicted dx16 ~500 ->
# ~470 us. f's backward GPU tests, A/B d / f (forward+backward), memcheck of the ssd cases on f.
R=$(pwd); O=$OUT/s31f; mkdir -p $O
for w in d f; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s31f.tgz s31f && rm -rf s31f; }
trap fin EXIT
echo "== f backward tests ($((SECONDS-T0)) s)" >> $S
run f 85 python3 -m pytest -q $T/tests/test_ssd_gpu.py -k "backward or kept_states or compiled_training" -m gpu -n 8 -p no:cacheprovider > $O/tests_bwd_f.txt 2>&1; echo "rc $?" >> $O/tests_bwd_f.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_bwd_f.txt | head -20 >> $S
for w in d f; do
  echo "-- $w ($((SECONDS-T0)) s)" >> $S
  run $w 60 python3 $T/tools/ssd_profile.py --shape 2k --reps 2 --paths 2 > $O/prof_2k_${w}.txt 2>&1
  grep -E "^## SSD|dx16" $O/prof_2k_${w}.txt >> $S
done
echo "== memcheck f ($((SECONDS-T0)) s)" >> $S; run f 30 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd > $O/memcheck.txt 2>&1; echo "rc $?" >> $O/memcheck.txt; grep -v "^========= *$" $O/memcheck.txt | tail -3 >> $S
