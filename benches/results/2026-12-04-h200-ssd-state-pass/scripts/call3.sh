#!/usr/bin/env bash
# stop 45 call 3: ncu of ssd2_chunk_state_pass (b8 L2048), sanitizers of the second forward path
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 3 "$OUT/logs/$name.log"; }
S="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats"
run ncu 150 ncu --profile-from-start off $S -k regex:ssd2_chunk_state_pass -c 1 python3 tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd
grep -E "Duration|Throughput|Busy|Eligible|Issued Warp|Stall|Registers|Achieved|Theoretical Occ|Hit Rate|Waves|Block Limit" $OUT/logs/ncu.log | head -60
for t in memcheck racecheck; do
  run $t 200 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd_fwd2
done
