#!/usr/bin/env bash
# stop 35 call 6 (wheel f = 19e2e1f + the stream's counter pair + the seqlen rule): TMA /
# attention GPU tests, sanitizers (stream pair, scratch), the quick attention bench and the
# training bench (cuDNN / FA2 in the same process), and the A/B around the rule's threshold
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-f .dev/wheel-f/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-f/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-f:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-f "$@"; }
run timeout 300 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py -k "not scan" -m gpu -q -p no:cacheprovider -n 8 > $L/tests-f.log 2>&1; echo "tests rc $?"; tail -3 $L/tests-f.log
grep -h "FAIL\|Error" $L/tests-f.log | head -5
CHK=$repo/tools/sm90_fwd_check.py
run timeout 120 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 python3 $CHK --quick > $L/chk.log 2>&1; echo "check rc $? $(tail -1 $L/chk.log)"
i=0
for cfg in "memcheck:" "racecheck:" "synccheck:" "racecheck:FLASHSCAN_SM90_QUEUE_SCRATCH=1"; do
  tool=${cfg%%:*}; extra=${cfg#*:}; i=$((i+1))
  run timeout -s KILL 240 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 $extra compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$i-$tool.log 2>&1 &
done
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS' $f | tr '\n' ' ')"; done
run timeout 240 python3 -m flashscan bench --quick --suite attention --no-plots --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?"
grep -E "^\| (64|128) " $L/bench/results.md | head -14
run timeout 200 python3 $repo/benches/backward.py --quick --suite attention --out $L/backward > $L/backward.log 2>&1; echo "backward rc $?"
grep -E "^\| (64|128) " $L/backward/results.md | head -10
SW=$repo/.dev/scripts/attn_sweep.py
C="one:FLASHSCAN_SM90_PERSIST=0;default:;queue:FLASHSCAN_SM90_PERSIST=queue"
run timeout 200 python3 $SW --chain 8 --rounds 4 --shapes 64:1024,64:8192,64:16384,128:1024,128:8192,128:16384 --configs "$C" > $L/causal-c8.jsonl 2>> $L/sweep.err; echo "causal rc $?"
python3 - $L/causal-c8.jsonl <<'PY'
import json, sys, statistics
for f in sys.argv[1:]:
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        b = keys[0]
        rr = {k: statistics.median(x / y for x, y in zip(r[k + "_all"], r[b + "_all"])) for k in keys}
        print(f"  {r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({rr[k]:.3f})" for k in keys))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
