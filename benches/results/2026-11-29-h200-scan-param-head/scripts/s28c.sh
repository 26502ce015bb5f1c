#!/bin/bash
# stop 28 call 3: conv1d channel-last short walks in 32-bit indices (c) against b (main's conv code)
R=$(pwd); O=$OUT/s28c; mkdir -p $O
for w in b c; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t28c ${TMPDIR}/t28c
for rep in 1 2; do for w in b c; do
  run $w 120 python3 ${TMPDIR}/t28c/tools/conv1d_profile.py $w --shape 32 640 60 > $O/prof_rt32_${w}_$rep.log 2>&1
  run $w 120 python3 ${TMPDIR}/t28c/tools/conv1d_profile.py $w --shape 1 640 60 > $O/prof_rt1_${w}_$rep.log 2>&1
done; done
run c 100 python3 ${TMPDIR}/t28c/tools/conv1d_profile.py c > $O/prof_2k_c.log 2>&1
run c 300 python3 -m pytest -q ${TMPDIR}/t28c/tests/test_conv_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_conv_c.log 2>&1
run c 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 ${TMPDIR}/t28c/tools/sanitize_cases.py conv > $O/memcheck_conv_c.log 2>&1; echo "memcheck rc $?" >> $O/memcheck_conv_c.log
cd $OUT && tar czf s28c.tgz s28c && rm -rf s28c
