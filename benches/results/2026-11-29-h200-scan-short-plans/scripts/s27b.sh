#!/bin/bash
# stop 27 call 2: main vs wheel a (idx32 short plans, early first loads) on the scan forward
R=$(pwd); O=$OUT/s27b; mkdir -p $O
for w in main a; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" "$@"; }
cp -r .dev/t27 ${TMPDIR}/t27
for rep in 1 2; do for w in main a; do
  run $w 120 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32,rt16,rt1 --reps 50 --out $O/sweep_rt_${w}_$rep.jsonl > $O/sweep_rt_${w}_$rep.log 2>&1
done; done
run a 60 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes rt32 --configs 4,8,128,4 --reps 50 --out $O/sweep_rt32_a_t8.jsonl > $O/sweep_rt32_a_t8.log 2>&1
for w in main a; do run $w 100 python3 ${TMPDIR}/t27/tools/scan_tile_sweep.py --shapes 2k --reps 10 --out $O/sweep_2k_$w.jsonl > $O/sweep_2k_$w.log 2>&1; done
run a 120 ncu --set full --import-source no --section SourceCounters -k regex:selective_scan_fwd -s 2 -c 1 -o $O/rt32_a python3 .dev/scripts/rt_one.py 32 > $O/ncu_a.log 2>&1
run a 60 ncu --import $O/rt32_a.ncu-rep --page details > $O/rt32_a_details.txt 2>&1
run a 60 ncu --import $O/rt32_a.ncu-rep --page source --print-source sass --csv > $O/rt32_a_sass.csv 2>&1
rm -f $O/*.ncu-rep
cd $OUT && tar czf s27b.tgz s27b && rm -rf s27b
