#!/usr/bin/env bash
# stop 35 call 2: the tile queue (wheel q = 33cf90d + the queue): TMA + attention GPU tests,
# memcheck / racecheck / synccheck with 2 CTAs and sections of 3 pairs, then the in-process A/B
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in q; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-q/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $L/info.txt
cd ${TMPDIR}
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run q timeout 300 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-q.log 2>&1; echo "tests rc $?"; tail -3 $L/tests-q.log
grep -h "FAIL" $L/tests-q.log | head -5
CHK=$repo/tools/sm90_fwd_check.py
# warm the kernel cache first (the sanitizers then time only the runs)
run q timeout 120 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 python3 $CHK --quick > $L/chk-q.log 2>&1; echo "check rc $? $(tail -1 $L/chk-q.log)"
for tool in memcheck racecheck synccheck; do
  run q timeout -s KILL 240 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$tool-q.log 2>&1 &
done
wait
for tool in memcheck racecheck synccheck; do echo "$tool: $(grep -h 'SUMMARY\|CORRECTNESS' $L/san-$tool-q.log | tr '\n' ' ')"; done
for r in 1 2; do
  run q timeout 200 python3 $repo/.dev/scripts/attn_ab2.py > $L/ab-$r.jsonl 2> $L/ab-$r.err; echo "ab $r rc $?"
  python3 - $L/ab-$r.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    keys = [k for k in r if k != "shape" and not k.endswith("_all")]
    base = r["one"]
    print(f"{r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f}" for k in keys) + "  | /one " + " ".join(f"{k} {r[k]/base:.3f}" for k in keys if k not in ("one",)) + f"  | default/cudnn {r['default']/r['cudnn']:.3f}")
PY
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
