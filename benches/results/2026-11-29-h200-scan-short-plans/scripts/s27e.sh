#!/bin/bash
# stop 27 call 5: channels a lane group (FS_CPT 2) on the real-time forward
R=$(pwd); O=$OUT/s27e; mkdir -p $O
for w in e; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t27 ${TMPDIR}/t27
run e 100 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32,rt16,rt1 --reps 50 --out $O/e_cpt1.jsonl > $O/e_cpt1.log 2>&1
FLASHSCAN_SCAN_CPT=2 run e 150 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32 --configs 8,16,128,4 8,32,128,4 16,32,128,4 8,16,64,8 --reps 50 --out $O/e_cpt2_rt32.jsonl > $O/e_cpt2_rt32.log 2>&1
FLASHSCAN_SCAN_CPT=2 run e 120 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt16,rt1 --configs 8,16,128,4 16,32,128,4 16,64,128,4 --reps 50 --out $O/e_cpt2_rt16_1.jsonl > $O/e_cpt2_rt16_1.log 2>&1
run e 100 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32 --reps 50 --out $O/e_cpt1b.jsonl > $O/e_cpt1b.log 2>&1
cd $OUT && tar czf s27e.tgz s27e && rm -rf s27e
