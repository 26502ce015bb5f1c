#!/usr/bin/env bash
# ncu of the scan backward (32-bit, DSTATE16_TILES) at b8 d2048 L2048
set -uo pipefail
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
[ -d $T/site/flashscan ] || python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl || exit 1
timeout 150 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy --print-details all -k regex:'selective_scan_bwd$' -s 2 -c 1 python3 .dev/scripts/scan_bwd_one.py 8 2048 2048 > $OUT/logs/ncu_bwd_2k.log 2>&1
echo "rc $?"
grep -E 'Duration|Issue Slots Busy|Executed Instructions  |Registers Per|Eligible Warps|Stall (Not|Wait|Short|MIO|Long|Barrier|Math|Dispatch)|  XU  |  ALU  |  FMA  |  LSU  |Shared Memory|Achieved Occ' $OUT/logs/ncu_bwd_2k.log | tr -s ' ' | head -30
