#!/usr/bin/env bash
# stop 34 call 3: the persistent TMA attention forward (wheel p) against main (wheel m)
set -uo pipefail
TMPDIR=${TMPDIR:-/tmp}
export PYTHONUNBUFFERED=1
for w in m p; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-m/COMMIT .dev/wheel-p/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
CHK=$repo/tools/sm90_fwd_check.py
# 1. fail fast: the quick cases on the persistent kernel walking many tiles (3 CTAs), and on the full grid
run p timeout -s KILL 90 env FLASHSCAN_SM90_PERSIST_CTAS=3 python3 $CHK --quick > $L/quick-p3.log 2>&1; echo "quick p3 rc $? $(grep CORRECTNESS $L/quick-p3.log)"
run p timeout -s KILL 90 python3 $CHK --quick > $L/quick-p.log 2>&1; echo "quick p rc $? $(grep CORRECTNESS $L/quick-p.log)"
# 2. timing, alternating
AT=$repo/.dev/scripts/attn_time.py
run p timeout 150 python3 $AT --tag p --peers > $L/time-p-1.jsonl 2> $L/time-p-1.err; echo "time p1 rc $?"
run m timeout 100 python3 $AT --tag m > $L/time-m-1.jsonl 2> $L/time-m-1.err; echo "time m1 rc $?"
run p timeout 100 env FLASHSCAN_SM90_PERSIST=0 python3 $AT --tag p0 > $L/time-p0-1.jsonl 2> $L/time-p0-1.err; echo "time p0 rc $?"
run p timeout 100 python3 $AT --tag p > $L/time-p-2.jsonl 2> $L/time-p-2.err; echo "time p2 rc $?"
python3 - $L <<'PY'
import json, sys, glob, collections
L = sys.argv[1]
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(L + "/time-*.jsonl")):
    tag = f.split("time-")[1].replace(".jsonl", "")
    for line in open(f):
        r = json.loads(line)
        rows[r["shape"]][tag] = r["ours_tflops"]
        if "cudnn_tflops" in r:
            rows[r["shape"]]["cudnn"] = r["cudnn_tflops"]
            rows[r["shape"]]["fa2"] = r["fa2_tflops"]
for s, d in rows.items():
    print(f"{s:28s}", "  ".join(f"{k} {v}" for k, v in sorted(d.items())))
PY
# 3. tests
run p timeout 300 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-tma-p.log 2>&1; echo "tma tests rc $?"; tail -3 $L/tests-tma-p.log
run p timeout 200 python3 -m pytest $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-attn-p.log 2>&1; echo "attn tests rc $?"; tail -3 $L/tests-attn-p.log
# 4. sanitizers on the persistent kernel walking many tiles
for tool in memcheck synccheck racecheck; do
  run p timeout -s KILL 120 env FLASHSCAN_SM90_PERSIST_CTAS=2 compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$tool-p.log 2>&1; echo "$tool rc $? $(grep -h 'ERROR SUMMARY\|CORRECTNESS' $L/san-$tool-p.log | tr '\n' ' ')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
