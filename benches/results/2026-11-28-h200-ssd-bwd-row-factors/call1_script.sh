#!/bin/bash
# stop 25, call 1: prep/compile-kept (.dev/wheel-n25, 7079416; its tests/benches in .dev/n25) beside main (.dev/wheel-head, ed04694).
# Predictions (H200, b8 L2048 80x64 state 128 chunk 256 bf16): ssd_bwd_share_sum_dc / _db 21 -> ~12 us each;
# ssd_bwd_reduce 36 -> 15-25 us; fwd+bwd 2457 -> ~2415 us; HILO=0: dstate16 170 -> ~130 us.
for w in head n25; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=${TMPDIR}/logs; mkdir -p $L
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
echo "== n25: ssd tests" | tee -a $S
run n25 220 python3 -m pytest -q .dev/n25/tests/test_ssd_gpu.py .dev/n25/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd.txt 2>&1; echo "rc $?" >> $L/tests_ssd.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd.txt | head -20 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
for r in 1 2; do for w in head n25; do
  echo "-- $w r$r"
  run $w 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_2k_${w}_$r.txt 2>&1
  grep -E "^## SSD forward\+|share_sum|bwd_reduce|dstate16" $L/prof_2k_${w}_$r.txt
  run $w 60 python3 tools/ssd_profile.py --shape rt --reps 8 --paths 2 > $L/prof_rt_${w}_$r.txt 2>&1
  grep -E "^## SSD forward\+|share_sum|bwd_reduce" $L/prof_rt_${w}_$r.txt
  if [ $w = n25 ]; then echo "-- n25 HILO=0 r$r"; run $w 60 env FLASHSCAN_SSD_DSTATE_HILO=0 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_2k_hilo0_$r.txt 2>&1; grep -E "^## SSD forward\+|dstate16" $L/prof_2k_hilo0_$r.txt; fi
done; done | tee -a $S
echo "== memcheck n25 ($((SECONDS-T0)) s)" | tee -a $S; run n25 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $L/memcheck.txt 2>&1; echo "rc $?" >> $L/memcheck.txt; grep -v "^========= *$" $L/memcheck.txt | tail -3 | tee -a $S
if [ $((SECONDS-T0)) -lt 440 ]; then
echo "== accuracy with one rounding in dstate16 ($((SECONDS-T0)) s)" | tee -a $S
run n25 100 env FLASHSCAN_SSD_DSTATE_HILO=0 python3 benches/results/2026-11-28-h200-ssd-kept-states/kept_seeds.py > $L/seeds_hilo0.txt 2>&1; tail -4 $L/seeds_hilo0.txt | tee -a $S
fi
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
