#!/bin/bash
# call 1: device check, seed replay (issue 11), cf-backward baseline + ncu (issue 14), peer build
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee $OUT/device.txt
for w in head; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl; done
export FLASHSCAN_COMMIT=$(cat .dev/wheel-head/COMMIT)
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
# peer build in the background (CPU only)
( cd .peers/causal-conv1d && MAX_JOBS=10 timeout 560 env PYTHONPATH=${TMPDIR}/site-head python3 -c "
import torch, sys
from flashscan.bench import conv1d_src
info = conv1d_src._build(torch, '.', '${TMPDIR}/ccbuild', print)
" > $OUT/peer_build.txt 2>&1; ls -la ${TMPDIR}/ccbuild >> $OUT/peer_build.txt 2>&1 ) &
PB=$!
export PYTHONUNBUFFERED=1
SWEEP=300 run head 200 python3 .dev/scripts/seed_replay.py > $OUT/seed_replay.txt 2>&1
FLASHSCAN_TEST_SEED=3434922452882669254 run head 200 python3 -m pytest -q tests/test_backward_gpu.py -k "sm90_matrix and b2-q7-k7-h2/2-d64-bfloat16-c0" -p no:cacheprovider >> $OUT/seed_replay.txt 2>&1
run head 200 python3 tools/conv1d_profile.py head > $OUT/conv_profile_head.txt 2>&1
run head 300 ncu --clock-control none --kernel-name causal_conv1d_bwd_cf --launch-skip 3 --launch-count 1 --set full python3 tools/conv1d_profile.py ncu > $OUT/ncu_bwd_cf.txt 2>&1
wait $PB
so=${TMPDIR}/ccbuild/causal_conv1d_cuda.so
if [ -f $so ]; then strip -o $OUT/causal_conv1d_cuda.so $so || cp $so $OUT/; ls -la $OUT; fi
