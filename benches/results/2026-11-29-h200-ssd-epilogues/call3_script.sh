#!/bin/bash
# stop 30 call 3: m = main 260e10f, e3 = 0346734 (the scan's epilogue of call 2 with D loaded before
# the W x loop at chunk > 64 (e1's form); ssd_bwd_chunk_dx16's epilogue: shared reads first, whole
# tiles unchecked; lane_d one load for per-head D). Predicted: scan ~361 us (e1), dx16 545 -> ~500.
R=$(pwd); O=$OUT/s30c; mkdir -p $O
for w in m e3; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t30; S=$O/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $S
ab() { for w in m e3; do
  echo "-- $w r$1"
  run $w 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_scan|dx16" $O/prof_2k_${w}_$1.txt
  run $w 40 python3 $T/tools/ssd_profile.py --shape rt --reps 8 --paths 2 > $O/prof_rt_${w}_$1.txt 2>&1
  grep -E "^## SSD" $O/prof_rt_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== e3 ssd tests ($((SECONDS-T0)) s)" >> $S
run e3 200 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_e3.txt 2>&1; echo "rc $?" >> $O/tests_ssd_e3.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_e3.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
for t in memcheck racecheck; do echo "== $t e3 ($((SECONDS-T0)) s)" >> $S; run e3 90 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
left=$((540 - (SECONDS-T0)))
echo "== Triton beside e3, 2k fwd + fwd+bwd (${left} s left)" >> $S
run e3 $left python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --mamba-src .dev/peers/mamba > $O/prof_2k_e3_triton.txt 2>&1; echo "rc $?" >> $O/prof_2k_e3_triton.txt
grep -E "^## " $O/prof_2k_e3_triton.txt >> $S
left=$((570 - (SECONDS-T0)))
echo "== Triton beside e3, 8k fwd (${left} s left)" >> $S
[ $left -gt 30 ] && run e3 $left python3 $T/tools/ssd_profile.py --shape 8k --reps 2 --paths 2 --fwd-only --mamba-src .dev/peers/mamba > $O/prof_8k_e3_triton.txt 2>&1
grep -E "^## " $O/prof_8k_e3_triton.txt >> $S
echo "done ($((SECONDS-T0)) s)" >> $S
cd $OUT && tar czf s30c.tgz s30c && rm -rf s30c
