#!/bin/bash
# stop 31 call 3: c = a (ssd2_chunk_state on wgmma) + ssd_bwd_chunk_dstate16 on the same wgmma
# product (L_c: dout^T scaled x C). Predicted dstate16 ~150 -> ~125 us, fwd+bwd -50 us (the
# backward's chunk-state recompute too). A/B m / c (two alternations), Triton beside c, SSD GPU
# tests + memcheck / racecheck (ssd, ssd_fwd2) on c, ncu of c's chunk_state.
R=$(pwd); O=$OUT/s31c; mkdir -p $O
for w in m c; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s31c.tgz s31c && rm -rf s31c; }
trap fin EXIT
ab() { for w in m c; do
  echo "-- $w r$1"
  run $w 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|dstate16|state_passing" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== c ssd tests ($((SECONDS-T0)) s)" >> $S
run c 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_c.txt 2>&1; echo "rc $?" >> $O/tests_ssd_c.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_c.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
echo "== c beside Triton ($((SECONDS-T0)) s)" >> $S
run c 120 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --mamba-src .dev/peers/mamba > $O/prof_2k_c_triton.txt 2>&1
grep -E "^## |^\| \*\*|total|Triton|mamba" $O/prof_2k_c_triton.txt | head -20 >> $S
for t in memcheck racecheck; do echo "== $t c ($((SECONDS-T0)) s)" >> $S; run c 60 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
echo "== ncu ($((SECONDS-T0)) s)" >> $S
run c 100 ncu --profile-from-start off --set full -k regex:"ssd2_chunk_state|ssd_bwd_chunk_dstate16" -c 2 -o $O/ncu_c python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range step > $O/ncu_c.log 2>&1
run c 30 ncu --import $O/ncu_c.ncu-rep --print-summary none > $O/ncu_c.txt 2>&1
rm -f $O/ncu_c.ncu-rep
