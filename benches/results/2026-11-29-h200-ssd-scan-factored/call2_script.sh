#!/bin/bash
# stop 26, call 2: m = main 00526ca, f = 5385af7 (factored decay in the scan and dx16), r = + CB
# columns refilled as consumed in dx16 (predicted 545 -> ~500 us) and the scan without CB staging
# (predicted 417 -> ~390)
for w in m f r; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w*/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w*/COMMIT | head -1 | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a $S
echo "== r: ssd tests" | tee -a $S
run r 200 python3 -m pytest -q .dev/t26/tests/test_ssd_gpu.py .dev/t26/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd_r.txt 2>&1; echo "rc $?" >> $L/tests_ssd_r.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd_r.txt | head -20 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
ab() { for w in m f r; do
  echo "-- $w r$1"
  run $w 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD forward|chunk_scan|dx16" $L/prof_2k_${w}_$1.txt
  [ $1 = 1 ] && run $w 40 python3 tools/ssd_profile.py --shape rt --reps 8 --paths 2 > $L/prof_rt_${w}_$1.txt 2>&1 && grep -E "^## SSD forward|chunk_scan|dx16" $L/prof_rt_${w}_$1.txt
done; }
ab 1 2>&1 | tee -a $S
for t in memcheck racecheck; do echo "== $t r ($((SECONDS-T0)) s)" | tee -a $S; run r 90 compute-sanitizer --tool $t --error-exitcode 9 python3 .dev/t26/tools/sanitize_cases.py ssd ssd_fwd2 > $L/$t.txt 2>&1; echo "rc $?" >> $L/$t.txt; grep -v "^========= *$" $L/$t.txt | tail -3 | tee -a $S; done
if [ $((SECONDS-T0)) -lt 400 ]; then echo "== A/B round 2 ($((SECONDS-T0)) s)" | tee -a $S; ab 2 2>&1 | tee -a $S; fi
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
