#!/usr/bin/env bash
# softcap dS recompute on the FMA pipe (B) vs MUFU (A): correctness of B, then A/B alternating processes
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site-a .dev/wheel-a/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
echo "A: $(cat .dev/wheel-a/COMMIT | tr '\n' ' ') B: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 6 "$OUT/logs/$name.log"; }
export FLASHSCAN_CACHE_DIR=$T/fscache
PYTHONPATH=$T/site run small 150 python3 tools/sm90_bwd_small.py
PYTHONPATH=$T/site run tests 200 python3 -m pytest tests/test_backward_gpu.py -q -p no:cacheprovider -n 6 -k "sm90" --maxfail=20
for r in 1 2 3; do
  PYTHONPATH=$T/site-a FLASHSCAN_CACHE_DIR=$T/fscache-a python3 .dev/cap_time.py A >> $OUT/logs/ab.log 2>&1
  PYTHONPATH=$T/site python3 .dev/cap_time.py B >> $OUT/logs/ab.log 2>&1
done
python3 - $OUT/logs/ab.log <<'PY'
import sys, collections
t = collections.defaultdict(list); sums = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 5 or p[0] not in "AB": continue
    t[(p[1], p[2], p[3], p[0])].append(float(p[4])); sums[(p[1], p[2], p[3], p[0])] = [float(x) for x in p[6:9]]
for key in sorted({k[:3] for k in t}):
    a, b = min(t[key + ("A",)]), min(t[key + ("B",)])
    sa, sb = sums[key + ("A",)], sums[key + ("B",)]
    rd = max(abs(x - y) / x for x, y in zip(sa, sb))
    print(f"| {' | '.join(key)} | {a:.4f} | {b:.4f} | {a / b:.3f}x | {rd:.1e} |")
PY
