#!/bin/bash
# stop 28 call 6: the head (f: the 64-bit variants' View refers to the fields, the conv forward's
# 32-bit body for 16-bit x only) against c; f's scan and conv GPU tests, scan memcheck
R=$(pwd); O=$OUT/s28f; mkdir -p $O
for w in c f; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t28f ${TMPDIR}/t28f
for w in c f; do
  run $w 100 python3 ${TMPDIR}/t28f/tools/scan_tile_sweep.py --shapes rt32,rt1,2k --reps 20 --out $O/fwd_${w}.jsonl > $O/fwd_${w}.log 2>&1
done
run f 200 python3 -m pytest -q ${TMPDIR}/t28f/tests/test_scan_gpu.py ${TMPDIR}/t28f/tests/test_backward_gpu.py ${TMPDIR}/t28f/tests/test_training_gpu.py ${TMPDIR}/t28f/tests/test_scan_server_gpu.py ${TMPDIR}/t28f/tests/test_conv_gpu.py -m gpu -n 12 -p no:cacheprovider > $O/tests_f.log 2>&1
run f 60 python3 ${TMPDIR}/t28f/tools/conv1d_profile.py f --shape 32 640 60 > $O/conv_rt32_f.log 2>&1
cd $OUT && tar czf s28f.tgz s28f && rm -rf s28f
