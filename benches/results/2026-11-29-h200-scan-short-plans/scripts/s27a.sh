#!/bin/bash
# stop 27 call 1: the real-time selective-scan forward on the H200: tile plans and an ncu profile
R=$(pwd); O=$OUT/s27a; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $O/gpu.txt
for w in main; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" "$@"; }
cp -r .dev/t27 ${TMPDIR}/t27
run main 200 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32 --configs 4,32,128,4 4,64,128,2 8,32,128,4 2,16,128,4 4,16,64,8 2,32,128,4 --reps 50 --out $O/sweep_rt32.jsonl > $O/sweep_rt32.log 2>&1
run main 100 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt16,rt1 --configs 4,32,128,4 --reps 50 --out $O/sweep_rt16_1.jsonl > $O/sweep_rt16_1.log 2>&1
run main 120 ncu --set full -k regex:selective_scan_fwd -s 2 -c 1 --import-source no -o $O/rt32 python3 .dev/scripts/rt_one.py 32 > $O/ncu.log 2>&1
run main 60 ncu --import $O/rt32.ncu-rep --page details > $O/rt32_details.txt 2>&1
run main 60 ncu --import $O/rt32.ncu-rep --page source --print-source sass --csv > $O/rt32_sass.csv 2>&1
cd $OUT && tar czf s27a.tgz s27a && rm -rf s27a
