#!/usr/bin/env bash
# stop 37 call 2 (wheel land1 = 3dfa521, head dim 256 on the TMA kernel, no dev switches): the
# attention GPU tests (forward, TMA, backward, training, torch, kvcache), sanitizers over the
# small hd256 / padded cases
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
w=land1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-$w/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run timeout 120 python3 $repo/benches/results/2026-12-02-h200-attention-hd256/scripts/hd256_small.py > $L/small-plain.log 2>&1; echo "small rc $?"; cat $L/small-plain.log
for tool in memcheck racecheck synccheck; do
  run timeout -s KILL 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/benches/results/2026-12-02-h200-attention-hd256/scripts/hd256_small.py > $L/san-$tool.log 2>&1 &
done
run timeout 420 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py $repo/tests/test_training_gpu.py $repo/tests/test_kvcache_gpu.py $repo/tests/test_torch_autograd.py $repo/tests/test_torch_eager.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests.log 2>&1; echo "tests rc $?"; tail -3 $L/tests.log
grep -h "FAIL" $L/tests.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|ALL OK\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
