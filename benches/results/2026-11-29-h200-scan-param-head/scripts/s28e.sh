#!/bin/bash
# stop 28 call 5: paired B / C staging (d) against c (main); d's scan GPU tests (+ the paired
# staging's edges) and memcheck
R=$(pwd); O=$OUT/s28e; mkdir -p $O
for w in c d; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t28d ${TMPDIR}/t28d
for rep in 1 2; do for w in c d; do
  run $w 120 python3 ${TMPDIR}/t28d/tools/scan_tile_sweep.py --shapes rt32,rt16,rt1 --reps 50 --out $O/fwd_rt_${w}_$rep.jsonl > $O/fwd_rt_${w}_$rep.log 2>&1
done; done
run d 300 python3 -m pytest -q ${TMPDIR}/t28d/tests/test_scan_gpu.py ${TMPDIR}/t28d/tests/test_backward_gpu.py ${TMPDIR}/t28d/tests/test_training_gpu.py ${TMPDIR}/t28d/tests/test_scan_server_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_d.log 2>&1
run d 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 ${TMPDIR}/t28d/tools/sanitize_cases.py scan > $O/memcheck_d.log 2>&1; echo "memcheck rc $?" >> $O/memcheck_d.log
cd $OUT && tar czf s28e.tgz s28e && rm -rf s28e
