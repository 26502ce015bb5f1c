#!/usr/bin/env bash
# stop 35 call 3 (wheel q2 = the queue as committed): the quick attention bench and the training
# bench's attention rows (cuDNN / FA2 in the same process), then the queue's section sweep
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-q2 .dev/wheel-q2/flashscan-*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-q2/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-q2 FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-q2 "$@"; }
run timeout 240 python3 -m flashscan bench --quick --suite attention --no-plots --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?"
grep -E "^\| (64|128) " $L/bench/results.md | head -14
run timeout 200 python3 $repo/benches/backward.py --quick --suite attention --out $L/backward > $L/backward.log 2>&1; echo "backward rc $?"
grep -E "^\|" $L/backward/results.md | head -20
SW=$repo/.dev/scripts/attn_sweep.py
C="one:FLASHSCAN_SM90_PERSIST=0;default:;s4:FLASHSCAN_SM90_QUEUE_SECTION=4;s16:FLASHSCAN_SM90_QUEUE_SECTION=16;s64:FLASHSCAN_SM90_QUEUE_SECTION=64;s256:FLASHSCAN_SM90_QUEUE_SECTION=256;all:FLASHSCAN_SM90_QUEUE_SECTION=100000"
run timeout 240 python3 $SW --configs "$C" > $L/sweep.jsonl 2> $L/sweep.err; echo "sweep rc $?"
C2="stride:;queue:FLASHSCAN_SM90_PERSIST=queue;q1:FLASHSCAN_SM90_PERSIST=queue,FLASHSCAN_SM90_QUEUE_SECTION=1;q8:FLASHSCAN_SM90_PERSIST=queue,FLASHSCAN_SM90_QUEUE_SECTION=8"
run timeout 150 python3 $SW --causal 0 --shapes 64:512,128:512,128:2048 --configs "$C2" > $L/sweep-unmasked.jsonl 2>> $L/sweep.err; echo "sweep unmasked rc $?"
python3 - $L/sweep.jsonl $L/sweep-unmasked.jsonl <<'PY'
import json, sys
for f in sys.argv[1:]:
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        base = r[keys[0]]
        print(f"{r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({r[k]/base:.3f})" for k in keys))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
