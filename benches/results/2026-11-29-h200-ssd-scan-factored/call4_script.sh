#!/bin/bash
# stop 26, call 4: l = 7f4cab5 (the landing commit: the scan's factored decay, SASS identical to
# 5385af7's scan): the new extreme-decay test, the SSD GPU tests, the forward beside Triton (2k, 8k)
for w in l; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | head -1 | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $S
echo "== l: extreme decays" | tee -a $S
run l 120 python3 -m pytest -q .dev/t26/tests/test_ssd_gpu.py -k extreme_decays -p no:cacheprovider > $L/tests_extreme.txt 2>&1; echo "rc $?" >> $L/tests_extreme.txt
grep -E "^FAILED|passed|failed|^rc|Error" $L/tests_extreme.txt | head -20 | tee -a $S
echo "== l: ssd tests ($((SECONDS-T0)) s)" | tee -a $S
run l 200 python3 -m pytest -q .dev/t26/tests/test_ssd_gpu.py .dev/t26/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $L/tests_ssd_l.txt 2>&1; echo "rc $?" >> $L/tests_ssd_l.txt
grep -E "^FAILED|passed|failed|^rc" $L/tests_ssd_l.txt | head -20 | tee -a $S
for sh in 2k 8k; do
  left=$((420 - (SECONDS-T0)))
  if [ $left -gt 40 ]; then echo "== forward $sh beside Triton (${left} s left)" | tee -a $S; run l $left python3 tools/ssd_profile.py --shape $sh --reps 4 --paths 2 --fwd-only --mamba-src .peers/mamba > $L/prof_${sh}_fwd_triton.txt 2>&1; grep -E "^## |chunk_scan" $L/prof_${sh}_fwd_triton.txt | tee -a $S; fi
done
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
