#!/bin/bash
# stop 26, call 5: l = 7f4cab5 (main's kernels, = fdcf52a's), c = the dcb16 change (blocks below the
# diagonal scale each head's g x^T by a_l b_s: two FMUL an element instead of FADD, FMUL, MUFU and
# two FMUL): predicted dcb16 ~346 -> ~300 us if its issue slots hold it (ncu 2026-11-28: 0.63
# issued a cycle per scheduler, the busiest of the 16-bit backward kernels)
for w in l c; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | head -1 | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $S
ab() { for w in l c; do
  echo "-- $w r$1"
  run $w 45 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD forward\+|dcb16" $L/prof_2k_${w}_$1.txt
done; }
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S; ab 1 2>&1 | tee -a $S
echo "== c: ssd tests ($((SECONDS-T0)) s)" | tee -a $S
run c 170 python3 -m pytest -q .dev/t26/tests/test_ssd_gpu.py .dev/t26/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd_c.txt 2>&1; echo "rc $?" >> $L/tests_ssd_c.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd_c.txt | head -20 | tee -a $S
echo "== memcheck c ($((SECONDS-T0)) s)" | tee -a $S; run c 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 .dev/t26/tools/sanitize_cases.py ssd > $L/memcheck.txt 2>&1; echo "rc $?" >> $L/memcheck.txt; grep -v "^========= *$" $L/memcheck.txt | tail -3 | tee -a $S
if [ $((SECONDS-T0)) -lt 270 ]; then echo "== racecheck c ($((SECONDS-T0)) s)" | tee -a $S; run c 50 compute-sanitizer --tool racecheck --error-exitcode 9 python3 .dev/t26/tools/sanitize_cases.py ssd > $L/racecheck.txt 2>&1; echo "rc $?" >> $L/racecheck.txt; grep -v "^========= *$" $L/racecheck.txt | tail -3 | tee -a $S; fi
if [ $((SECONDS-T0)) -lt 300 ]; then echo "== A/B round 2 ($((SECONDS-T0)) s)" | tee -a $S; ab 2 2>&1 | tee -a $S; fi
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
