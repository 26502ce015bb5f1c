#!/bin/bash
# stop 29 call 6: the wide channel-last forward (8 channels a lane, wheel w) against the same wheel with
# FLASHSCAN_CONV1D_WIDE=0 (the 4-channel kernel) at b8 L2048 d5376; w's conv GPU tests and memcheck
R=$(pwd); O=$OUT/s29f; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-w .dev/wheel-w/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t29w
echo "ab ($((SECONDS-T0)) s)" >> $O/times.txt
for r in 1 2; do for v in 0 1; do
  echo "== wide=$v round $r" >> $O/ab.log; FLASHSCAN_CONV1D_WIDE=$v run w 60 python3 $T/tools/conv1d_profile.py wide$v 2>&1 | grep -v -i warn | grep " cl:" >> $O/ab.log
done; done
echo "tests ($((SECONDS-T0)) s)" >> $O/times.txt
run w 150 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_w.log 2>&1
echo "memcheck ($((SECONDS-T0)) s)" >> $O/times.txt
run w 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py conv > $O/memcheck_w.log 2>&1; echo "rc $?" >> $O/memcheck_w.log
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s29f.tgz s29f && rm -rf s29f
