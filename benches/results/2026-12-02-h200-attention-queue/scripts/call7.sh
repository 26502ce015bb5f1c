#!/usr/bin/env bash
# stop 35 call 7: warpgroups pass on the KV tiles none of their rows sees (persistent builds;
# wheel k) against c95f18f (wheel f): TMA GPU tests + racecheck / memcheck on k, then each wheel's
# persistent / one-tile ratio in its own process (the one-tile kernels are the same SASS in both)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in f k; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-f/COMMIT .dev/wheel-k/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
CHK=$repo/tools/sm90_fwd_check.py
for tool in racecheck memcheck; do
  run k timeout -s KILL 150 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$tool-k.log 2>&1 &
done
run k timeout 150 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-k.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-k.log
grep -h "FAIL" $L/tests-k.log | head -5
wait
for tool in racecheck memcheck; do echo "$tool: $(grep -h 'SUMMARY\|CORRECTNESS' $L/san-$tool-k.log | tr '\n' ' ')"; done
SW=$repo/.dev/scripts/attn_sweep.py
C="one:FLASHSCAN_SM90_PERSIST=0;default:"
for w in f k; do
  run $w timeout 60 python3 $SW --chain 8 --rounds 3 --shapes 64:512,64:1024,64:2048,128:512 --configs "$C" > $L/causal-$w.jsonl 2>> $L/sweep.err; echo "causal $w rc $?"
  run $w timeout 60 python3 $SW --causal 0 --chain 8 --rounds 3 --shapes 64:512,64:2048,128:512 --configs "$C" > $L/unmasked-$w.jsonl 2>> $L/sweep.err; echo "unmasked $w rc $?"
done
python3 - $L <<'PY'
import json, sys, statistics
L = sys.argv[1]
for kind in ("causal", "unmasked"):
    rows = {}
    for w in ("f", "k"):
        for l in open(f"{L}/{kind}-{w}.jsonl"):
            r = json.loads(l)
            ratio = statistics.median(x / y for x, y in zip(r["default_all"], r["one_all"]))
            rows.setdefault(r["shape"], {})[w] = (r["default"], r["one"], ratio)
    for s, d in rows.items():
        f, k = d.get("f"), d.get("k")
        print(f"{s:26s} f {f[0]:6.1f} (one {f[1]:6.1f}, x{f[2]:.3f})  k {k[0]:6.1f} (one {k[1]:6.1f}, x{k[2]:.3f})  k/f ratio-of-ratios {k[2]/f[2]:.3f}")
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
