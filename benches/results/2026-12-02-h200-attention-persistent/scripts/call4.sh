#!/usr/bin/env bash
# stop 34 call 4: synccheck / racecheck of the persistent kernel (the check's baseline on SDPA's
# math backend now), then the A/B in alternating processes, cuDNN beside each (the drift reference)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in m p; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-m/COMMIT .dev/wheel-p/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
CHK=$repo/tools/sm90_fwd_check.py
for tool in synccheck racecheck; do
  run p timeout -s KILL 120 env FLASHSCAN_SM90_PERSIST_CTAS=2 compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$tool-p.log 2>&1; echo "$tool rc $? $(grep -h 'ERROR SUMMARY\|CORRECTNESS' $L/san-$tool-p.log | tr '\n' ' ')"
done
AT=$repo/.dev/scripts/attn_time.py
for r in 1 2 3; do
  run p timeout 60 python3 $AT --tag p --peers --causal-seqlens 2048 > $L/time-p-$r.jsonl 2> $L/time-p-$r.err
  run p timeout 60 env FLASHSCAN_SM90_PERSIST=0 python3 $AT --tag p0 --peers --causal-seqlens 2048 > $L/time-p0-$r.jsonl 2> $L/time-p0-$r.err
  run m timeout 60 python3 $AT --tag m --peers --causal-seqlens 2048 > $L/time-m-$r.jsonl 2> $L/time-m-$r.err
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
print("shape | TFLOP/s median (min-max) per config | ours / cuDNN of the same process, median")
for s in ours:
    cells = []
    for t in ("m", "p0", "p", "cudnn"):
        v = ours[s][t]
        if v:
            cells.append(f"{t} {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
    rr = "  ".join(f"{t} {statistics.median(ratio[s][t]):.3f}" for t in ("m", "p0", "p") if ratio[s][t])
    print(f"{s:26s} " + "  ".join(cells) + "  | " + rr)
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
