#!/bin/bash
# stop 32 call 5: e = c (acc303a) + the wgmma state product on 64 positions a step in two stages
# (ssd2_chunk_state, ssd2_varlen_states, ssd_bwd_chunk_dstate16: the same 64 positions in flight as
# three stages of 32, half the barriers and wgmma waits, four m64n128k16 a step; 128 registers, four
# CTAs an SM). Predicted chunk_state 118 -> ~105, dstate16 130 -> ~118. A/B c/e two alternations,
# SSD GPU tests + memcheck / racecheck on e; c (main) beside Triton at 8k (forward) for the record.
R=$(pwd); O=$OUT/s32e; mkdir -p $O
for w in c e; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32e.tgz s32e && rm -rf s32e; }
trap fin EXIT
ab() { for w in $2; do
  echo "-- $w r$1"
  run $w 100 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|chunk_scan|dstate16|state_passing" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 "c e" >> $S 2>&1
echo "== e ssd tests ($((SECONDS-T0)) s)" >> $S
run e 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_e.txt 2>&1; echo "rc $?" >> $O/tests_ssd_e.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_e.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 "e c" >> $S 2>&1
for t in memcheck racecheck; do echo "== $t e ($((SECONDS-T0)) s)" >> $S; run e 70 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
echo "== c beside Triton, forward 8k ($((SECONDS-T0)) s)" >> $S
run c 150 python3 $T/tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only --mamba-src .dev/peers/mamba > $O/prof_8k_c_triton.txt 2>&1
grep -E "^## " $O/prof_8k_c_triton.txt >> $S
echo "== e 8k forward ($((SECONDS-T0)) s)" >> $S
run e 60 python3 $T/tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only > $O/prof_8k_e.txt 2>&1
grep -E "^## |chunk_state|chunk_scan" $O/prof_8k_e.txt >> $S
