#!/usr/bin/env bash
# scan forward: FS_TAIL (full tiles without the 4-step exit tests) and FS_POLY_NUM, one wheel
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
repo=$PWD
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 2 "$OUT/logs/$name.log"; }
show() { python3 -c "import json,sys; [print(' ', r['shape'], r['config'], r.get('kernel_us'), r.get('graph_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, open(sys.argv[1]))]" $1; }
SW=tools/scan_tile_sweep.py
T2=@FLASHSCAN_SCAN_TAIL=2
for r in 1; do
  run rt_$r 170 python3 $SW --shapes rt32,rt16,rt1 --reps 50 --out $OUT/logs/rt_$r.jsonl --configs $T2 @FLASHSCAN_SCAN_TAIL=0 "4,32,128,4$T2" "$T2;FLASHSCAN_SCAN_POLY=1" @FLASHSCAN_SCAN_TAIL=1
  show $OUT/logs/rt_$r.jsonl
done
run big 200 python3 $SW --shapes 2k,8k,16k --reps 10 --out $OUT/logs/big.jsonl --configs $T2 @FLASHSCAN_SCAN_TAIL=0 "$T2;FLASHSCAN_SCAN_POLY=1" "$T2;FLASHSCAN_SCAN_POLY=2" @FLASHSCAN_SCAN_TAIL=1 $T2
show $OUT/logs/big.jsonl
for t in 1 2; do
  FLASHSCAN_SCAN_TAIL=$t run ncu_2k_t$t 90 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy --print-details all -k regex:selective_scan_fwd -s 2 -c 1 python3 .dev/scripts/scan_one.py 8 2048 2048
  grep -E 'Duration|Issue Slots Busy|Executed Instructions  |Registers Per|Eligible Warps|Stall|XU|ALU|FMA' $OUT/logs/ncu_2k_t$t.log | tr -s ' ' | head -30
done
