#!/bin/bash
# stop 28 call 2: where the real-time backward's kernel time goes (ncu, b32 and b1), and the eager
# training step's host cost on this machine (profile_overhead --backward, training_step)
R=$(pwd); O=$OUT/s28b; mkdir -p $O
for w in b; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
cp -r .dev/t28 ${TMPDIR}/t28
for bb in 32 1; do
  run b 120 ncu --set full --import-source no --section SourceCounters -k regex:'selective_scan_bwd$' -s 2 -c 1 -o $O/bwd$bb python3 .dev/scripts/rt_bwd.py $bb > $O/ncu_bwd$bb.log 2>&1
  run b 60 ncu --import $O/bwd$bb.ncu-rep --page details > $O/bwd${bb}_details.txt 2>&1
  run b 60 ncu --import $O/bwd$bb.ncu-rep --page source --print-source sass --csv > $O/bwd${bb}_sass.csv 2>&1
done
rm -f $O/*.ncu-rep
run b 200 python3 ${TMPDIR}/t28/tools/profile_overhead.py --backward > $O/overhead_bwd.log 2>&1
cd ${TMPDIR}/t28 && run b 200 python3 benches/training_step.py --out $O/training > $O/training_step.log 2>&1
cd $OUT && tar czf s28b.tgz s28b && rm -rf s28b
