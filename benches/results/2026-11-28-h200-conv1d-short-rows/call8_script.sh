#!/bin/bash
# stop 21 call 8: the head's wheel (9c259d8): the conv1d bench with causal-conv1d in the same process, the
# real-time kernels' profile, the conv GPU tests
pip install -q --no-deps --no-index --target ${TMPDIR}/site-final .dev/wheel-final/*.whl 2>/dev/null
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
run final 120 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc $?" | tee $OUT/s8.txt
echo "== rt profile ($((SECONDS-T0)) s)" | tee -a $OUT/s8.txt
run final 60 python3 tools/conv1d_profile.py final --peer .peers/causal-conv1d .dev/peer-cc --shape 32 640 60 2>&1 | grep -v -i warn | tee -a $OUT/s8.txt
echo "== tests ($((SECONDS-T0)) s)" | tee -a $OUT/s8.txt
run final 100 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider > $OUT/tests.txt 2>&1; echo "rc $?" >> $OUT/tests.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests.txt | head -10 | tee -a $OUT/s8.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/s8.txt
