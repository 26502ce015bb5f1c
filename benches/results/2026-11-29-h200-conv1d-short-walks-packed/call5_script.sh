#!/bin/bash
# stop 29 call 5: the channel-last lean forward with 4 (e) / 5 (f) ring stages for 16-bit x against the
# head h (3) at b8 L2048 d5376; conv GPU tests on e and f; ncu of h's forward there
R=$(pwd); O=$OUT/s29e; mkdir -p $O
for w in h e f; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t29h
echo "ab ($((SECONDS-T0)) s)" >> $O/times.txt
for r in 1 2; do for w in h e f; do
  echo "== $w round $r" >> $O/ab.log; run $w 60 python3 $T/tools/conv1d_profile.py $w 2>&1 | grep -v -i warn | grep " cl:" >> $O/ab.log
done; done
echo "tests ($((SECONDS-T0)) s)" >> $O/times.txt
run e 200 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 6 -p no:cacheprovider > $O/tests_e.log 2>&1 &
run f 200 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 6 -p no:cacheprovider > $O/tests_f.log 2>&1
wait
echo "ncu ($((SECONDS-T0)) s)" >> $O/times.txt
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis"
for w in h f; do run $w 90 ncu --kernel-name regex:"^causal_conv1d_fwd_cl$" --launch-skip 3 --launch-count 1 $S python3 $T/tools/conv1d_profile.py ncu > $O/ncu_fwd_cl_$w.txt 2>&1; done
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s29e.tgz s29e && rm -rf s29e
