#!/usr/bin/env bash
# stop 34 call 6: the quick bench's attention rows on wheel p (the persistent forward the default)
set -uo pipefail
TMPDIR=${TMPDIR:-/tmp}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-p .dev/wheel-p/flashscan-*.whl || exit 1
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-p/COMMIT | tee $L/info.txt
cd ${TMPDIR}
PYTHONPATH=${TMPDIR}/site-p FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-p timeout 240 python3 -m flashscan bench --quick --suite attention --no-plots --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?"
grep -E "^\| (64|128) " $L/bench/results.md | head -14
cd $OUT && tar czf logs.tgz logs && rm -rf logs
