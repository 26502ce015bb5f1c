#!/bin/bash
# next stop, call 1 (prepared at the end of stop 22). Wheels: .dev/wheel-head = main (c5e1b83 or later),
# .dev/wheel-next = prep/next23 (conv update window store; d719c5d: SSD prologue / bwd_dt / D-epilogue loads first, and the
# FLASHSCAN_CONV_CL_SHORT_ROWS override). Predictions (H200, b8 L2048 80x64 state 128 chunk 256 bf16):
# ssd2_chunk_prep 18.3 -> ~8 us, ssd_bwd_dt ~75 -> ~30, chunk_scan / dx16 -a few us; real-time SSD forward
# 9.3 -> ~8.5; conv cl forward b8 L2048 on the short kernel (rows 8) 100 -> ~90 (85% of copy).
for w in head next; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== next: ssd tests" | tee $OUT/n3.txt
run next 200 python3 -m pytest -q .dev/tests-next/test_ssd_gpu.py .dev/tests-next/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $OUT/tests_next_ssd.txt 2>&1; echo "rc $?" >> $OUT/tests_next_ssd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_next_ssd.txt | head | tee -a $OUT/n3.txt
echo "== next: conv tests with FLASHSCAN_CONV_CL_SHORT_ROWS=8 ($((SECONDS-T0)) s)" | tee -a $OUT/n3.txt
FLASHSCAN_CONV_CL_SHORT_ROWS=8 run next 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_next_conv8.txt 2>&1; echo "rc $?" >> $OUT/tests_next_conv8.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_next_conv8.txt | head | tee -a $OUT/n3.txt
echo "== SSD A/B ($((SECONDS-T0)) s)" | tee -a $OUT/n3.txt
for w in head next head next; do echo "-- $w"; run $w 90 python3 tools/ssd_profile.py --shape 2k --reps 4 2>&1 | grep -E "^## |prep|_dt\`|chunk_scan\`|dx16|scan_one"; run $w 60 python3 tools/ssd_profile.py --shape rt --reps 4 --fwd-only 2>&1 | grep -E "^## SSD forward.*FWD=2"; done | tee -a $OUT/n3.txt
echo "== conv A/B ($((SECONDS-T0)) s)" | tee -a $OUT/n3.txt
for i in 1 2; do for r in unset 8 4; do
  if [ $r = unset ]; then run next 60 python3 tools/conv1d_profile.py rows-default 2>&1 | grep " cl:"; else FLASHSCAN_CONV_CL_SHORT_ROWS=$r run next 60 python3 tools/conv1d_profile.py rows-$r 2>&1 | grep " cl:"; fi
done; done | tee -a $OUT/n3.txt
echo "== update A/B ($((SECONDS-T0)) s)" | tee -a $OUT/n3.txt
for w in head next head next; do run $w 60 python3 benches/results/2026-11-28-h200-conv1d-short-rows/upd_ab.py $w 2>&1 | grep -v -i warn; done | tee -a $OUT/n3.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/n3.txt
# call 2: memcheck / racecheck of next over `tools/sanitize_cases.py ssd ssd_fwd2 conv` (conv also with the override),
# the whole GPU suite on whatever lands (limit 400 s: it needs ~280 s and its summary).
