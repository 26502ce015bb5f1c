#!/bin/bash
# stop 28 call 1: main / a / b scan forward (32-bit parameter head), main / b backward (hoisted
# softplus / z tests); b's scan GPU tests, memcheck, ncu of the real-time forward
R=$(pwd); O=$OUT/s28a; mkdir -p $O
for w in main a b; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t28 ${TMPDIR}/t28
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $O/gpu.txt
for rep in 1 2; do for w in main a b; do
  run $w 120 python3 ${TMPDIR}/t28/tools/scan_tile_sweep.py --shapes rt32,rt16,rt1 --reps 50 --out $O/fwd_rt_${w}_$rep.jsonl > $O/fwd_rt_${w}_$rep.log 2>&1
done; done
for w in main b; do run $w 100 python3 ${TMPDIR}/t28/tools/scan_tile_sweep.py --shapes 2k --reps 10 --out $O/fwd_2k_$w.jsonl > $O/fwd_2k_$w.log 2>&1; done
for rep in 1 2; do for w in main b; do
  run $w 150 python3 ${TMPDIR}/t28/tools/scan_tile_sweep.py --bwd --shapes rt32,rt1,2k --reps 20 --out $O/bwd_${w}_$rep.jsonl > $O/bwd_${w}_$rep.log 2>&1
done; done
run b 300 python3 -m pytest -q ${TMPDIR}/t28/tests/test_scan_gpu.py ${TMPDIR}/t28/tests/test_backward_gpu.py ${TMPDIR}/t28/tests/test_training_gpu.py ${TMPDIR}/t28/tests/test_scan_server_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_b.log 2>&1
run b 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 ${TMPDIR}/t28/tools/sanitize_cases.py scan > $O/memcheck_b.log 2>&1; echo "memcheck rc $?" >> $O/memcheck_b.log
run b 100 ncu --set full --import-source no --section SourceCounters -k regex:selective_scan_fwd -s 2 -c 1 -o $O/rt32_b python3 .dev/scripts/rt_one.py 32 > $O/ncu_b.log 2>&1
run b 60 ncu --import $O/rt32_b.ncu-rep --page details > $O/rt32_b_details.txt 2>&1
run b 60 ncu --import $O/rt32_b.ncu-rep --page source --print-source sass --csv > $O/rt32_b_sass.csv 2>&1
rm -f $O/*.ncu-rep
cd $OUT && tar czf s28a.tgz s28a && rm -rf s28a
