#!/usr/bin/env bash
# stop 34 call 7: main a869281 (wheel f): the attention GPU tests, backward and training included
set -uo pipefail
TMPDIR=${TMPDIR:-/tmp}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-f .dev/wheel-f/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-f/COMMIT | tee $L/info.txt
cd ${TMPDIR}
PYTHONPATH=${TMPDIR}/site-f:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-f timeout 200 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py -k "not scan" -m gpu -q -p no:cacheprovider -n 8 > $L/tests-f.log 2>&1; echo "tests rc $?"; tail -4 $L/tests-f.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
