#!/usr/bin/env bash
# stop 36 call 5 (wheel h = the tree to land: forward desc_at + conditional rescale (pipelined /
# ping-pong), backward desc_at, the mask of 1b6acd5): TMA / attention / backward GPU tests,
# sanitizers, the training bench, and small shapes (real-time, decode-like, tails) against wheel
# p (e1167dd + the counter patches, before this stop's kernel changes) in alternating processes
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in h p; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-h/COMMIT .dev/wheel-p/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run h timeout -s KILL 200 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $repo/tools/sm90_fwd_check.py --quick > $L/san-fwd-racecheck.log 2>&1 &
run h timeout -s KILL 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $repo/tools/sm90_fwd_check.py --quick > $L/san-fwd-memcheck.log 2>&1 &
for tool in memcheck racecheck synccheck; do
  run h timeout -s KILL 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/tools/sm90_bwd_small.py > $L/san-bwd-$tool.log 2>&1 &
done
run h timeout 280 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py -k "not scan" -m gpu -q -p no:cacheprovider -n 8 > $L/tests-h.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-h.log
grep -h "FAIL\|Error" $L/tests-h.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS\|ALL OK\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
for i in 1 2; do for w in p h; do run $w timeout 60 python3 $repo/.dev/scripts/rt_attn.py > $L/rt-$w-$i.json 2>> $L/rt.err; done; done
python3 - $L <<'PY'
import json, sys
L = sys.argv[1]
res = {w: [json.load(open(f"{L}/rt-{w}-{i}.json")) for i in (1, 2)] for w in ("p", "h")}
for j, row in enumerate(res["p"][0]):
    ps = [r[j]["us"] for r in res["p"]]; hs = [r[j]["us"] for r in res["h"]]
    print(f"  {row['shape']:32s} p {ps}  h {hs}  h/p {min(hs)/min(ps):.3f}")
PY
run h timeout 150 python3 $repo/benches/backward.py --quick --suite attention --out $L/backward > $L/backward.log 2>&1; echo "backward rc $?"
grep -E "^\| (64|128) " $L/backward/results.md | head -10
cd $OUT && tar czf logs.tgz logs && rm -rf logs
