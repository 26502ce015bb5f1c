#!/bin/bash
# call 2: the lean channel-first backward (issue 14): tests, sanitizers, A/B profile, peer
set -x
for w in head cf8 cf6; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat .dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
( cd .peers/causal-conv1d && MAX_JOBS=8 timeout 560 env PYTHONPATH=${TMPDIR}/site-cf8 python3 -c "
import torch
from flashscan.bench import conv1d_src
conv1d_src._build(torch, '.', '${TMPDIR}/ccbuild', print)
" > $OUT/peer_build.txt 2>&1 ) &
PB=$!
run cf8 300 python3 -m pytest -q -x tests/test_conv_gpu.py -n 6 -p no:cacheprovider > $OUT/tests_conv.txt 2>&1
tail -3 $OUT/tests_conv.txt
for t in memcheck racecheck synccheck; do
  run cf8 200 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv > $OUT/san_$t.txt 2>&1; echo "$t rc=$?" >> $OUT/san_summary.txt
done
cat $OUT/san_summary.txt
for w in head cf8 cf6 cf8 head cf6; do run $w 200 python3 tools/conv1d_profile.py $w 2>&1 | grep -v Warn | grep -v warn_once >> $OUT/profile_ab.txt; done
cat $OUT/profile_ab.txt
wait $PB
cat $OUT/peer_build.txt
run cf8 300 python3 tools/conv1d_profile.py cf8 --peer .peers/causal-conv1d ${TMPDIR}/ccbuild 2>&1 | grep -v Warn | grep -v warn_once > $OUT/profile_peer.txt
cat $OUT/profile_peer.txt
so=${TMPDIR}/ccbuild/causal_conv1d_cuda.so
if [ -f $so ]; then strip -o ${TMPDIR}/cc.so $so; split -b 15M ${TMPDIR}/cc.so $OUT/ccso.part.; ls -la $OUT; fi
