#!/usr/bin/env bash
# stop 44 call 3: ssd2_chunk_scan_ws first run: a quick test, A/B against ssd2_chunk_scan, SSD GPU tests, sanitizers
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
run quick 120 python3 -m pytest tests/test_ssd_gpu.py -q -p no:cacheprovider -k warp_specialised -x
grep -E "passed|failed|Error|error" $OUT/logs/quick.log | head -20
for r in 1 2; do
  FLASHSCAN_SSD_SCAN_WS=0 run prof_old_$r 100 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |chunk_scan" $OUT/logs/prof_old_$r.log
  run prof_ws_$r 100 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |chunk_scan" $OUT/logs/prof_ws_$r.log
done
run prof_ws_8k 100 python3 tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only
grep -E "^## |chunk_scan" $OUT/logs/prof_ws_8k.log
run tests 280 python3 -m pytest tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -q -p no:cacheprovider -n 8
grep -E "passed|failed|^FAILED" $OUT/logs/tests.log | head -20
for t in memcheck racecheck synccheck; do
  run $t 100 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd_fwd2
done
