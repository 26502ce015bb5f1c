#!/bin/bash
# stop 25, call 4: prep/dcb16-rows (v4 = 1d724e1) on main (v2 = c8a4c9b, the landed kernels):
#  ffcbd2b: ssd_bwd_dcb16's cum / dt' rows by cp.async in the stage group (predicted 362 -> ~320 us)
#  1d724e1: ssd_bwd_chunk_dx16's state term in two cp.async stages (predicted 556 -> ~520 us)
# Gradients bitwise equal (same products, same order). Budget ~380 s: the steps in order of need.
for w in v2 v4; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
echo "== v4: ssd tests" | tee -a $S
run v4 160 python3 -m pytest -q .dev/l25/tests/test_ssd_gpu.py .dev/l25/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd_v4.txt 2>&1; echo "rc $?" >> $L/tests_ssd_v4.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd_v4.txt | head -20 | tee -a $S
echo "== bitwise ($((SECONDS-T0)) s)" | tee -a $S
for w in v2 v4; do run $w 60 python3 .dev/scripts/bitwise_dcdb.py ${TMPDIR}/bw_$w.npz > $L/bitwise_$w.txt 2>&1; tail -1 $L/bitwise_$w.txt; done | tee -a $S
python3 .dev/scripts/bitwise_dcdb.py ${TMPDIR}/bw_v2.npz ${TMPDIR}/bw_v4.npz 2>&1 | tail -5 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
ab() { for w in v2 v4; do
  echo "-- $w r$1"
  run $w 40 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD forward\+|dx16|dcb16" $L/prof_2k_${w}_$1.txt
  [ $1 = 1 ] && run $w 40 python3 tools/ssd_profile.py --shape rt --reps 8 --paths 2 > $L/prof_rt_${w}_$1.txt 2>&1 && grep -E "^## SSD forward\+|dx16|dcb16" $L/prof_rt_${w}_$1.txt
done; }
ab 1 2>&1 | tee -a $S
for t in memcheck racecheck; do echo "== $t v4 ($((SECONDS-T0)) s)" | tee -a $S; run v4 70 compute-sanitizer --tool $t --error-exitcode 9 python3 .dev/sanitize_cases.py ssd > $L/$t.txt 2>&1; echo "rc $?" >> $L/$t.txt; grep -v "^========= *$" $L/$t.txt | tail -3 | tee -a $S; done
if [ $((SECONDS-T0)) -lt 300 ]; then echo "== A/B round 2 ($((SECONDS-T0)) s)" | tee -a $S; ab 2 2>&1 | tee -a $S; fi
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
