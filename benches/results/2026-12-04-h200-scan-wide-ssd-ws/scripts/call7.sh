#!/usr/bin/env bash
# stop 44 call 7: ssd2_chunk_scan_ws with three consumer warpgroups and 16-bit C B^T (opt-in), A/B
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
run quick 100 python3 -m pytest tests/test_ssd_gpu.py -q -p no:cacheprovider -k warp_specialised -x
grep -E "passed|failed|Error|error" $OUT/logs/quick.log | head -10
for r in 1 2; do
  run prof_old_$r 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |chunk_scan|chunk_cb" $OUT/logs/prof_old_$r.log
  FLASHSCAN_SSD_SCAN_WS=1 run prof_ws_$r 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |chunk_scan|chunk_cb" $OUT/logs/prof_ws_$r.log
done
FLASHSCAN_SSD_SCAN_WS=1 run prof_ws_8k 60 python3 tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only
grep -E "^## |chunk_scan" $OUT/logs/prof_ws_8k.log
