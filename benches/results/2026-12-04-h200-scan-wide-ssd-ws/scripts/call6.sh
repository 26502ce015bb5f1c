#!/usr/bin/env bash
# stop 44 call 6: ncu warp-state stalls of ssd2_chunk_scan_ws (pipelined) and ssd2_chunk_scan, b8 L2048
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
S="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --print-details all"
timeout -s KILL 100 ncu --profile-from-start off $S -k regex:ssd2_chunk_scan_ws -c 1 python3 tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $OUT/logs/ncu_ws.log 2>&1
FLASHSCAN_SSD_SCAN_WS=0 timeout -s KILL 100 ncu --profile-from-start off $S -k regex:ssd2_chunk_scan -c 1 python3 tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $OUT/logs/ncu_old.log 2>&1
for f in ws old; do echo "== $f"; grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Active Warps|Stall|stall" $OUT/logs/ncu_$f.log | tr -s ' ' | head -40; done
