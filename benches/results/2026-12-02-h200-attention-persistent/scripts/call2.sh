#!/usr/bin/env bash
# stop 34 call 2: the quick bench (attention, latency, scan with mamba_ssm built from source, state
# update) and the training bench's attention rows on the H200, main 1c47bd9 (wheel m)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-m .dev/wheel-m/flashscan-*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-m/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $L/info.txt
git -C $repo log -1 --format=%H >> $L/info.txt 2>/dev/null
cp -r $repo/.dev/peers/mamba ${TMPDIR}/mamba
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-m FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-m MAX_JOBS=16 "$@"; }
run timeout 330 python3 -m flashscan bench --quick --no-plots --mamba-src ${TMPDIR}/mamba --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" >> $L/bench.log
tail -4 $L/bench.log
grep -E "^\|" $L/bench/results.md | head -80
run timeout 200 python3 $repo/benches/backward.py --quick --suite attention --out $L/backward > $L/backward.log 2>&1; echo "backward rc $?" >> $L/backward.log
tail -2 $L/backward.log
grep -E "^\|" $L/backward/results.md | head -40
cd $OUT && tar czf logs.tgz logs && rm -rf logs
