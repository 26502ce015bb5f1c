#!/usr/bin/env bash
# stop 36 call 4 (wheel g = forward final form (desc_at, conditional rescale in the pipelined /
# ping-pong schedules) + backward with FLASHSCAN_DEV_BWD_DESC_OLD / _MASK_OLD switches): TMA /
# attention / backward GPU tests (new forms), sanitizers, the backward 2x2 A/B in one process,
# the quick attention and training benches (cuDNN / FA2 in the same process)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-g .dev/wheel-g/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-g/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-g:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-g "$@"; }
run timeout -s KILL 200 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $repo/tools/sm90_fwd_check.py --quick > $L/san-fwd-racecheck.log 2>&1 &
for tool in memcheck racecheck; do
  run timeout -s KILL 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/tools/sm90_bwd_small.py > $L/san-bwd-$tool.log 2>&1 &
done
run timeout 280 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py -k "not scan" -m gpu -q -p no:cacheprovider -n 8 > $L/tests-g.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-g.log
grep -h "FAIL\|Error" $L/tests-g.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): rc-lines $(grep -ch 'ok\|FAIL' $f) $(grep -h 'SUMMARY\|CORRECTNESS\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
C="base:FLASHSCAN_DEV_BWD_DESC_OLD=1,FLASHSCAN_DEV_BWD_MASK_OLD=1;desc:FLASHSCAN_DEV_BWD_MASK_OLD=1;mask:FLASHSCAN_DEV_BWD_DESC_OLD=1;both:"
run timeout 200 python3 $repo/.dev/scripts/bwd_sweep.py --rounds 3 --shapes 64:512:1,64:2048:0,64:2048:1,64:8192:1,128:512:1,128:2048:0,128:2048:1,128:8192:1 --configs "$C" > $L/bwd.jsonl 2> $L/bwd.err; echo "bwd sweep rc $?"; tail -2 $L/bwd.err
python3 - $L/bwd.jsonl <<'PY'
import json, sys, statistics
for f in sys.argv[1:]:
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        b = keys[0]
        rr = {k: statistics.median(x / y for x, y in zip(r[k + "_all"], r[b + "_all"])) for k in keys}
        print(f"  {r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({rr[k]:.3f})" for k in keys))
PY
run timeout 200 python3 -m flashscan bench --quick --suite attention --no-plots --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?"
grep -E "^\| (64|128) " $L/bench/results.md | head -14
run timeout 150 python3 $repo/benches/backward.py --quick --suite attention --out $L/backward > $L/backward.log 2>&1; echo "backward rc $?"
grep -E "^\| (64|128) " $L/backward/results.md | head -10
cd $OUT && tar czf logs.tgz logs && rm -rf logs
