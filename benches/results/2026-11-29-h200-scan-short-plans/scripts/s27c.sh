#!/bin/bash
# stop 27 call 3: main / a / c on the scan forward; c's scan GPU tests and memcheck
R=$(pwd); O=$OUT/s27c; mkdir -p $O
for w in main a c; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t27 ${TMPDIR}/t27
for rep in 1 2; do for w in main a c; do
  run $w 120 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32,rt16,rt1 --reps 50 --out $O/sweep_rt_${w}_$rep.jsonl > $O/sweep_rt_${w}_$rep.log 2>&1
done; done
for w in main c; do run $w 100 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes 2k,8k --reps 10 --out $O/sweep_big_$w.jsonl > $O/sweep_big_$w.log 2>&1; done
run c 300 python3 -m pytest -q ${TMPDIR}/t27/tests/test_scan_gpu.py ${TMPDIR}/t27/tests/test_backward_gpu.py ${TMPDIR}/t27/tests/test_training_gpu.py ${TMPDIR}/t27/tests/test_scan_server_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_c.log 2>&1
run c 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 ${TMPDIR}/t27/tools/sanitize_cases.py scan > $O/memcheck_c.log 2>&1; echo "memcheck rc $?" >> $O/memcheck_c.log
run c 100 ncu --set full --import-source no --section SourceCounters -k regex:selective_scan_fwd -s 2 -c 1 -o $O/rt32_c python3 .dev/scripts/rt_one.py 32 > $O/ncu_c.log 2>&1
run c 60 ncu --import $O/rt32_c.ncu-rep --page details > $O/rt32_c_details.txt 2>&1
run c 60 ncu --import $O/rt32_c.ncu-rep --page source --print-source sass --csv > $O/rt32_c_sass.csv 2>&1
rm -f $O/*.ncu-rep
cd $OUT && tar czf s27c.tgz s27c && rm -rf s27c
