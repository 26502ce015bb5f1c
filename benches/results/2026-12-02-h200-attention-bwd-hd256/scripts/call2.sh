#!/usr/bin/env bash
# hd256 wgmma backward: in-process A/B of dQ in halves (default) vs one batch; ncu of the default
set -uo pipefail
export PYTHONUNBUFFERED=1
repo="$PWD"; mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 12 "$OUT/logs/$name.log"; }
run ab 300 python3 .dev/bwd_ab.py
run ncu 200 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats --section Occupancy \
  -k regex:flash_bwd_sm90 -s 1 -c 1 python3 .dev/ncu_one.py
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issued Warp|No Eligible|Eligible Warps|Registers Per|Executed Ipc|L2 Cache Throughput|DRAM Throughput|Warp Cycles Per Issued" $OUT/logs/ncu.log | head -30
