#!/bin/bash
# stop 28 call 4: the real-time forward's plans with smaller blocks (a warp or two: fewer warps
# behind each tile barrier), head c
R=$(pwd); O=$OUT/s28d; mkdir -p $O
for w in c; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t28c ${TMPDIR}/t28c
for rep in 1 2; do
run c 300 python3 ${TMPDIR}/t28c/tools/scan_tile_sweep.py --shapes rt32,rt16,rt1 --reps 50 --configs 4,16,32,16 4,16,64,8 4,16,32,8 4,16,64,6 8,16,32,16 8,16,64,8 --out $O/sweep_$rep.jsonl > $O/sweep_$rep.log 2>&1
done
cd $OUT && tar czf s28d.tgz s28d && rm -rf s28d
