#!/usr/bin/env bash
# stop 36 call 3 (wheel ab3 = 1b6acd5 + wgmma descriptors stepped by desc_at + the conditional
# rescale; FLASHSCAN_DEV_DESC_OLD=1 / FLASHSCAN_DEV_RESCALE_ALWAYS=1 compile the old forms): TMA /
# attention GPU tests on the new forms (+ the rescale test), memcheck / racecheck, the in-process
# 2x2 A/B (chains of 8), the quick attention bench (cuDNN / FA2 in the same process)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-ab3 .dev/wheel-ab3/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-ab3/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-ab3:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-ab3 "$@"; }
CHK=$repo/tools/sm90_fwd_check.py
run timeout -s KILL 200 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $CHK --quick > $L/san-racecheck.log 2>&1 &
run timeout -s KILL 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $CHK --quick > $L/san-memcheck.log 2>&1 &
run timeout 240 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-ab3.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-ab3.log
grep -h "FAIL\|Error" $L/tests-ab3.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS' $f | tr '\n' ' ')"; done
SW=$repo/.dev/scripts/attn_sweep.py
C="base:FLASHSCAN_DEV_DESC_OLD=1,FLASHSCAN_DEV_RESCALE_ALWAYS=1;desc:FLASHSCAN_DEV_RESCALE_ALWAYS=1;resc:FLASHSCAN_DEV_DESC_OLD=1;both:"
run timeout 170 python3 $SW --causal 0 --chain 8 --rounds 3 --shapes 64:512,64:2048,64:8192,128:512,128:2048,128:8192 --configs "$C" > $L/unmasked.jsonl 2>> $L/sweep.err; echo "unmasked rc $?"
run timeout 150 python3 $SW --chain 8 --rounds 3 --shapes 64:512,64:2048,64:8192,128:512,128:2048,128:8192 --configs "$C" > $L/causal.jsonl 2>> $L/sweep.err; echo "causal rc $?"
python3 - $L/unmasked.jsonl $L/causal.jsonl <<'PY'
import json, sys, statistics
for f in sys.argv[1:]:
    print(f.rsplit("/", 1)[-1])
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        b = keys[0]
        rr = {k: statistics.median(x / y for x, y in zip(r[k + "_all"], r[b + "_all"])) for k in keys}
        print(f"  {r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({rr[k]:.3f})" for k in keys))
PY
tail -3 $L/sweep.err
run timeout 200 python3 -m flashscan bench --quick --suite attention --no-plots --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?"
grep -E "^\| (64|128) " $L/bench/results.md | head -14
cd $OUT && tar czf logs.tgz logs && rm -rf logs
