#!/bin/bash
# stop 22 call 1: whole GPU suite on main's wheel (8372089); prep/conv-next (3f9ab33) conv tests + A/B; SSD fwd profile with the Triton peer (H200 baseline)
for w in head next; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/d1.txt
echo "== head suite" | tee -a $OUT/d1.txt
(cd /tmp && run head 330 python3 -m pytest $R/tests -m gpu -n 8 -q -p no:cacheprovider > $OUT/suite_head.txt 2>&1; echo "rc $?" >> $OUT/suite_head.txt)
grep -E "FAILED|ERROR|passed|failed|^rc" $OUT/suite_head.txt | head -20 | tee -a $OUT/d1.txt
cp .dev/tests-next/test_conv_gpu.py tests/test_conv_gpu.py
echo "== next conv tests ($((SECONDS-T0)) s)" | tee -a $OUT/d1.txt
run next 150 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests_next.txt 2>&1; echo "rc $?" >> $OUT/tests_next.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_next.txt | head -20 | tee -a $OUT/d1.txt
P="--peer .peers/causal-conv1d .dev/peer-cc"
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/d1.txt
for w in head next head next; do run $w 60 python3 tools/conv1d_profile.py $w 2>&1 | grep " cf:\| cl:"; run $w 60 python3 tools/conv1d_profile.py $w --shape 32 640 60 2>&1 | grep " cf:\| cl:"; done | tee -a $OUT/d1.txt
run next 60 python3 tools/conv1d_profile.py next $P 2>&1 | grep " cf:\| cl:" | tee -a $OUT/d1.txt
run next 60 python3 tools/conv1d_profile.py next $P --shape 32 640 60 2>&1 | grep " cf:\| cl:" | tee -a $OUT/d1.txt
echo "== ssd profile ($((SECONDS-T0)) s)" | tee -a $OUT/d1.txt
run head 100 python3 tools/ssd_profile.py --shape 2k --reps 4 --fwd-only --mamba-src .peers/mamba > $OUT/ssd_fwd_2k.txt 2>&1
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/d1.txt
