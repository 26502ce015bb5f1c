#!/bin/bash
# stop 25, call 3: dc16 / db16 / dstate16 latency work on prep/land25 (l25 = 85aafb6):
#  v1 = 64d175f: row factors from cum / dt rows in the stage's cp.async group; partials as 8-byte pairs
#  v2 = c8a4c9b: v1 + three cp.async stages (dc16 / db16 in dynamic smem; dstate16 static) on sm_90
# Predicted (H200, b8 L2048): dc16 235 -> ~200 (v1) -> ~180 (v2); db16 205 -> ~175 -> ~160; dstate16 150 -> ~145 (v2).
# Gradients bitwise equal across the three (same factors, same sums in the same order).
for w in l25 v1 v2; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=${TMPDIR}/logs; mkdir -p $L
S=$OUT/summary.txt
echo "== v2: ssd tests" | tee -a $S
run v2 200 python3 -m pytest -q .dev/l25/tests/test_ssd_gpu.py .dev/l25/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd_v2.txt 2>&1; echo "rc $?" >> $L/tests_ssd_v2.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd_v2.txt | head -20 | tee -a $S
echo "== bitwise ($((SECONDS-T0)) s)" | tee -a $S
for w in l25 v1 v2; do run $w 90 python3 .dev/scripts/bitwise_dcdb.py ${TMPDIR}/bw_$w.npz > $L/bitwise_$w.txt 2>&1; tail -1 $L/bitwise_$w.txt; done | tee -a $S
for w in v1 v2; do echo "-- l25 vs $w"; python3 .dev/scripts/bitwise_dcdb.py ${TMPDIR}/bw_l25.npz ${TMPDIR}/bw_$w.npz | tail -5; done | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
for r in 1 2; do for w in l25 v1 v2; do
  echo "-- $w r$r"
  run $w 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_2k_${w}_$r.txt 2>&1
  grep -E "^## SSD forward\+|dc16|db16|dstate16|share_sum" $L/prof_2k_${w}_$r.txt
  run $w 60 python3 tools/ssd_profile.py --shape rt --reps 8 --paths 2 > $L/prof_rt_${w}_$r.txt 2>&1
  grep -E "^## SSD forward\+|dc16|db16|dstate16" $L/prof_rt_${w}_$r.txt
done; done 2>&1 | tee -a $S
for t in memcheck racecheck; do echo "== $t v2 ($((SECONDS-T0)) s)" | tee -a $S; run v2 100 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $L/$t.txt 2>&1; echo "rc $?" >> $L/$t.txt; grep -v "^========= *$" $L/$t.txt | tail -3 | tee -a $S; done
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
