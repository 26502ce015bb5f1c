#!/usr/bin/env bash
# stop 44 call 2: GPU tests of the wide forward plan; backward 256-thread tile sweep
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 2 "$OUT/logs/$name.log"; }
show() { python3 -c "import json,sys; [print(' ', r['shape'], r['config'], r.get('kernel_us'), r.get('graph_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, open(sys.argv[1]))]" $1; }
SW=tools/scan_tile_sweep.py
run bwd 200 python3 $SW --bwd --shapes 2k,8k --reps 5 --out $OUT/logs/bwd.jsonl --configs 4,8,256,2 4,8,128,4 4,8,256,2 8,8,256,2
show $OUT/logs/bwd.jsonl
run tests 250 python3 -m pytest tests/test_scan_gpu.py tests/test_training_gpu.py tests/test_scan_server_gpu.py -q -p no:cacheprovider -n 4
grep -E "passed|failed|^FAILED" $OUT/logs/tests.log | head
