#!/bin/bash
# stop 32 call 3: c = main + the scan prologue in 32-bit (b8 L2048: scan 334 -> 324 in call 2), wgmma
# descriptors stepped by a 32-bit add (desc_at) and whole swizzled tiles loaded without per-pass predicates
# (predicted scan -3..5% more). A/B r/c two alternations (forward+backward), SSD GPU tests +
# memcheck / racecheck on c, then c beside Triton (forward).
R=$(pwd); O=$OUT/s32c; mkdir -p $O
for w in r c; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32c.tgz s32c && rm -rf s32c; }
trap fin EXIT
ab() { for w in $2; do
  echo "-- $w r$1"
  run $w 100 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|chunk_scan|dstate16|state_passing" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 "r c" >> $S 2>&1
echo "== c ssd tests ($((SECONDS-T0)) s)" >> $S
run c 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_c.txt 2>&1; echo "rc $?" >> $O/tests_ssd_c.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_c.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 "c r" >> $S 2>&1
for t in memcheck racecheck; do echo "== $t c ($((SECONDS-T0)) s)" >> $S; run c 70 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
echo "== c beside Triton, forward ($((SECONDS-T0)) s)" >> $S
run c 150 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only --mamba-src .dev/peers/mamba > $O/prof_2k_c_triton.txt 2>&1
grep -E "^## |chunk_scan|chunk_state|state_passing|_chunk_scan_fwd|_chunk_state_fwd|_state_passing_fwd|bmm|cumsum" $O/prof_2k_c_triton.txt | head -30 >> $S
