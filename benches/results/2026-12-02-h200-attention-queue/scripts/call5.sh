#!/usr/bin/env bash
# stop 35 call 5 (wheel e = 19e2e1f + stream counters that the kernel zeroes, + the early take
# under test): TMA GPU tests (concurrent streams, graph capture), sanitizers on the early and
# scratch paths, then the A/B: late / scratch / early, single calls and chains of 8
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-e .dev/wheel-e/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-e/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-e:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-e "$@"; }
run timeout 300 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-e.log 2>&1; echo "tests rc $?"; tail -3 $L/tests-e.log
grep -h "FAIL\|Error" $L/tests-e.log | head -5
CHK=$repo/tools/sm90_fwd_check.py
run timeout 120 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 python3 $CHK --quick > $L/chk.log 2>&1; echo "check rc $? $(tail -1 $L/chk.log)"
i=0
for cfg in "memcheck:" "racecheck:" "synccheck:" "racecheck:FLASHSCAN_SM90_PERSIST=early" "memcheck:FLASHSCAN_SM90_QUEUE_SCRATCH=1"; do
  tool=${cfg%%:*}; extra=${cfg#*:}; i=$((i+1))
  run timeout -s KILL 240 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 $extra compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$i-$tool.log 2>&1 &
done
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS' $f | tr '\n' ' ')"; done
SW=$repo/.dev/scripts/attn_sweep.py
C="one:FLASHSCAN_SM90_PERSIST=0;late:;scratch:FLASHSCAN_SM90_QUEUE_SCRATCH=1;early:FLASHSCAN_SM90_PERSIST=early"
C2="stride:;q1:FLASHSCAN_SM90_PERSIST=queue,FLASHSCAN_SM90_QUEUE_SECTION=1;q1s:FLASHSCAN_SM90_PERSIST=queue,FLASHSCAN_SM90_QUEUE_SECTION=1,FLASHSCAN_SM90_QUEUE_SCRATCH=1;q1e:FLASHSCAN_SM90_PERSIST=early,FLASHSCAN_SM90_QUEUE_SECTION=1"
for chain in 8 1; do
  run timeout 200 python3 $SW --chain $chain --rounds 4 --shapes 64:512,64:1024,64:2048,64:4096,64:16384,128:512,128:2048,128:16384 --configs "$C" > $L/causal-c$chain.jsonl 2>> $L/sweep.err; echo "causal chain $chain rc $?"
done
run timeout 150 python3 $SW --causal 0 --chain 8 --rounds 4 --shapes 64:512,128:512,128:2048 --configs "$C2" > $L/unmasked-c8.jsonl 2>> $L/sweep.err; echo "unmasked rc $?"
python3 - $L/causal-c8.jsonl $L/causal-c1.jsonl $L/unmasked-c8.jsonl <<'PY'
import json, sys, statistics
for f in sys.argv[1:]:
    print(f.rsplit("/", 1)[1])
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        b = keys[0]
        rr = {k: statistics.median(x / y for x, y in zip(r[k + "_all"], r[b + "_all"])) for k in keys}
        print(f"  {r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({rr[k]:.3f})" for k in keys))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
