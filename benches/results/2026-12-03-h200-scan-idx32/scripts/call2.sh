#!/usr/bin/env bash
# scan forward: 32-bit indices for the long plans (FLASHSCAN_SCAN_IDX32=1), one wheel
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
I=@FLASHSCAN_SCAN_IDX32=1
run big 200 python3 $SW --shapes 2k,8k,16k --reps 10 --configs $I @FLASHSCAN_SCAN_IDX32=0 $I
show $OUT/logs/big.log
FLASHSCAN_SCAN_IDX32=1 run tests_idx 260 python3 -m pytest tests/test_scan_gpu.py tests/test_training_gpu.py -q -p no:cacheprovider -n 4
FLASHSCAN_SCAN_IDX32=1 run ncu_2k_idx 60 ncu --section SpeedOfLight --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis -k regex:selective_scan_fwd -s 2 -c 1 python3 .dev/scripts/scan_one.py 8 2048 2048
grep -E 'Duration|Issue Slots Busy|Executed Instructions  |Registers|XU  ' $OUT/logs/ncu_2k_idx.log | tr -s ' ' | head
