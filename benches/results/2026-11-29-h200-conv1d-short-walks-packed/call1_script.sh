#!/bin/bash
# stop 29 call 1: main's conv1d short walks at the real-time shapes: GPU time and ncu (source counters)
R=$(pwd); O=$OUT/s29a; mkdir -p $O
for w in m; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
T=.dev/t29a
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $O/gpu.txt
for s in "32 640 60" "1 640 60"; do run m 60 python3 $T/tools/conv1d_profile.py m --shape $s >> $O/prof_m.log 2>&1; done
S="--set full --section SourceCounters --import-source no"
for k in causal_conv1d_fwd_cl_short causal_conv1d_bwd_cl_short; do
  run m 90 ncu --clock-control none --kernel-name regex:"^$k" --launch-skip 3 --launch-count 1 $S -o $O/ncu_$k python3 $T/tools/conv1d_profile.py ncu --shape 32 640 60 > $O/ncu_$k.log 2>&1
  run m 30 ncu --import $O/ncu_$k.ncu-rep --print-summary none > $O/ncu_$k.txt 2>&1
  run m 30 ncu --import $O/ncu_$k.ncu-rep --page source --print-source sass --csv > $O/ncu_${k}_src.csv 2>&1
done
for s in "32 640 60"; do run m 60 python3 $T/tools/conv1d_profile.py m --shape $s >> $O/prof_m.log 2>&1; done
cd $OUT && tar czf s29a.tgz s29a && rm -rf s29a
