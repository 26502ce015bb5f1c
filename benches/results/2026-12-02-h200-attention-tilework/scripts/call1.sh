#!/usr/bin/env bash
# stop 35 call 1: the tile-work patch (x = a3bee56 + tilework_main_order.patch): TMA + attention GPU
# tests, racecheck; then causal/unmasked timing, wheels m (1c47bd9, before persistence), a (a3bee56),
# x in alternating processes, order rotated per round, cuDNN beside each (the drift reference)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in m a x; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-m/COMMIT .dev/wheel-a/COMMIT .dev/wheel-x/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $L/info.txt
cd ${TMPDIR}
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run x timeout 240 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-x.log 2>&1; echo "tests rc $?"; tail -3 $L/tests-x.log
CHK=$repo/tools/sm90_fwd_check.py
run x timeout -s KILL 150 env FLASHSCAN_SM90_PERSIST_CTAS=2 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $CHK --quick > $L/san-racecheck-x.log 2>&1; echo "racecheck rc $? $(grep -h 'ERROR SUMMARY\|CORRECTNESS' $L/san-racecheck-x.log | tr '\n' ' ')"
AT=$repo/.dev/scripts/attn_time.py
orders=("m a x" "a x m" "x m a" "m x a")
for r in 1 2 3 4; do
  for w in ${orders[$((r-1))]}; do
    run $w timeout 90 python3 $AT --tag $w --peers --seqlens 512,2048,16384 --causal-seqlens 512,1024,2048,4096,16384 > $L/time-$w-$r.jsonl 2> $L/time-$w-$r.err
  done
  echo "round $r done"
done
python3 - $L <<'PY'
import json, sys, glob, collections, statistics
L = sys.argv[1]
ours = collections.defaultdict(lambda: collections.defaultdict(list))
ratio = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(L + "/time-*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        ours[r["shape"]][r["tag"]].append(r["ours_tflops"])
        ratio[r["shape"]][r["tag"]].append(r["ours_tflops"] / r["cudnn_tflops"])
        ours[r["shape"]]["cudnn"].append(r["cudnn_tflops"])
print("shape | TFLOP/s median (min-max) per wheel | ours / cuDNN of the same process, median")
for s in ours:
    cells = []
    for t in ("m", "a", "x", "cudnn"):
        v = ours[s][t]
        if v:
            cells.append(f"{t} {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
    rr = "  ".join(f"{t} {statistics.median(ratio[s][t]):.3f}" for t in ("m", "a", "x") if ratio[s][t])
    print(f"{s:26s} " + "  ".join(cells) + "  | " + rr)
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
