#!/usr/bin/env bash
# the scan with 32-bit dstate-16 plans, forward and backward: backward A/B, tests, memcheck
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
show() { grep '^{' $1 | python3 -c "import json,sys; [print(' ', r['shape'], r['config'], r.get('kernel_us'), r.get('graph_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, sys.stdin)]"; }
SW=tools/scan_tile_sweep.py
run bwd 170 python3 $SW --bwd --shapes 2k,8k --reps 10 --configs @FLASHSCAN_SCAN_IDX32=0 @FLASHSCAN_SCAN_IDX32=1 @FLASHSCAN_SCAN_IDX32=0
show $OUT/logs/bwd.log
run tests 150 python3 -m pytest tests/test_scan_gpu.py tests/test_training_gpu.py tests/test_scan_server_gpu.py -q -p no:cacheprovider -n 4
run memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py scan backward
grep -E "ERROR SUMMARY|err " $OUT/logs/memcheck.log | head -5
