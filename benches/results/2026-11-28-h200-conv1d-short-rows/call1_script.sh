#!/bin/bash
# stop 21 call 1: the whole GPU suite on the head (d190218); the cf-forward prep: tests + A/B vs head
for w in head cffwd; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/s1.txt
T0=$SECONDS
echo "== cffwd conv tests" | tee -a $OUT/s1.txt
run cffwd 120 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider 2>&1 | tail -3 | tee -a $OUT/s1.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/s1.txt
for w in head cffwd head cffwd; do run $w 60 python3 tools/conv1d_profile.py $w 2>&1 | grep -v -i warn; done > $OUT/ab.txt
grep " cf:\| cl:" $OUT/ab.txt | tee -a $OUT/s1.txt
echo "== full GPU suite, head ($((SECONDS-T0)) s)" | tee -a $OUT/s1.txt
cd /tmp && run head 400 python3 -m pytest $R/tests -m gpu -n 8 -q -p no:cacheprovider --durations=10 > $OUT/gpu_suite_head.txt 2>&1; echo "rc $?" >> $OUT/gpu_suite_head.txt; cd $R
grep -E "FAILED|ERROR|passed|failed|^rc" $OUT/gpu_suite_head.txt | tail -30 | tee -a $OUT/s1.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/s1.txt
