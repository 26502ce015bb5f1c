#!/usr/bin/env bash
# stop 45 call 5: the kept-states tests with the alignment-aware kernel names; ncu of the TMA-fed ssd2_chunk_state_pass
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
run tests 200 python3 -m pytest tests/test_ssd_gpu.py -q -p no:cacheprovider -n 4 -k "forward_states or fused_state_passing or carried_state or compiled_training or prep_records"
grep -E "passed|failed|Error" $OUT/logs/tests.log | tail -8
S="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy"
run ncu 150 ncu --profile-from-start off $S -k regex:ssd2_chunk_state_pass -c 1 python3 tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd
grep -E "Duration|Throughput|Busy|Eligible|Issued Warp|Registers|Achieved|Warp Cycles|stalled" $OUT/logs/ncu.log | head -30
