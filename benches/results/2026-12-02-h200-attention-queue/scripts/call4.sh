#!/usr/bin/env bash
# stop 35 call 4 (wheel q2): is the queue's cost against the stride on the GPU or on the host
# (scratch alloc + memset + free a call)? single synced calls against 8 back-to-back calls a timing
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-q2 .dev/wheel-q2/flashscan-*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-q2/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-q2 FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-q2 "$@"; }
SW=$repo/.dev/scripts/attn_sweep.py
C2="stride:;q1:FLASHSCAN_SM90_PERSIST=queue,FLASHSCAN_SM90_QUEUE_SECTION=1;queue:FLASHSCAN_SM90_PERSIST=queue;one:FLASHSCAN_SM90_PERSIST=0"
for chain in 1 8; do
  run timeout 150 python3 $SW --causal 0 --chain $chain --rounds 4 --shapes 64:512,128:512,128:2048 --configs "$C2" > $L/unmasked-c$chain.jsonl 2>> $L/sweep.err; echo "unmasked chain $chain rc $?"
done
C="one:FLASHSCAN_SM90_PERSIST=0;default:;s1:FLASHSCAN_SM90_QUEUE_SECTION=1;s8:FLASHSCAN_SM90_QUEUE_SECTION=8;s32:FLASHSCAN_SM90_QUEUE_SECTION=32"
run timeout 200 python3 $SW --chain 8 --rounds 4 --configs "$C" > $L/causal-c8.jsonl 2>> $L/sweep.err; echo "causal rc $?"
python3 - $L/unmasked-c1.jsonl $L/unmasked-c8.jsonl $L/causal-c8.jsonl <<'PY'
import json, sys, statistics
for f in sys.argv[1:]:
    print(f.rsplit("/", 1)[1])
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        b = keys[0]
        # per-round ratios to the first configuration, then their median
        rr = {k: statistics.median(x / y for x, y in zip(r[k + "_all"], r[b + "_all"])) for k in keys}
        print(f"  {r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({rr[k]:.3f})" for k in keys))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
