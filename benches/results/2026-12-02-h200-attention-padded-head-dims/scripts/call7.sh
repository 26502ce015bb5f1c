#!/usr/bin/env bash
# stop 36 call 7 (wheel pad = 6cfdf0d + padded head dims on the TMA kernel): the TMA GPU tests
# (with the padded cases), memcheck / racecheck of small padded cases and of sm90_fwd_check, the
# padded path (default) against the mma.sync kernel (FLASHSCAN_SM90_PAD=0) in one process, SDPA
# cuDNN / FA2 beside
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-pad .dev/wheel-pad/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-pad/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-pad:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-pad "$@"; }
for tool in memcheck racecheck; do
  run timeout -s KILL 120 env FLASHSCAN_SM90_WGMMA=1 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/.dev/scripts/pad_small.py > $L/san-pad-$tool.log 2>&1 &
done
run timeout -s KILL 150 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $repo/tools/sm90_fwd_check.py --quick > $L/san-fwd-racecheck.log 2>&1 &
run timeout 200 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-pad.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-pad.log
grep -h "FAIL" $L/tests-pad.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS\|ALL OK\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
run timeout 150 python3 $repo/.dev/scripts/pad_sweep.py --rounds 3 --shapes 32:2048:0,40:2048:1,48:2048:0,48:2048:1,80:2048:0,80:2048:1,96:512:0,96:2048:0,96:2048:1,96:8192:0,96:8192:1,112:2048:0,112:2048:1 > $L/pad.jsonl 2> $L/pad.err; echo "pad sweep rc $?"; tail -2 $L/pad.err
python3 - $L/pad.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"  {r['shape']:26s} mma {r['mma']:6.1f}  tma {r['tma']:6.1f} ({r['tma']/r['mma']:.2f}x)  cudnn {r['cudnn']:6.1f}  fa2 {r['fa2']:6.1f}  diff {r['max|tma-mma|']:.1e}")
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
