#!/usr/bin/env bash
# deterministic wgmma backward with chains (call 2): small shapes (plain and deterministic), GPU tests, sanitizers on the deterministic walk, then the A/B
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$(date +%s)
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/logs/gpu.txt
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 16 "$OUT/logs/$name.log"; }
run small-det 200 env FLASHSCAN_SM90_BWD=1 python3 tools/sm90_bwd_small.py --deterministic
if ! grep -q "ALL OK" $OUT/logs/small-det.log; then echo "small shapes failed: stopping"; exit 1; fi
( run tests-varlen 220 python3 -m pytest tests/test_varlen_gpu.py -q -p no:cacheprovider -n 5 -k "backward" --maxfail=20
  run tests 240 python3 -m pytest tests/test_backward_gpu.py -q -p no:cacheprovider -n 5 -k "attention" --maxfail=20 ) &
( run small-plain 100 env FLASHSCAN_SM90_BWD=1 python3 tools/sm90_bwd_small.py
  for tool in memcheck racecheck synccheck; do
    run "san-$tool" 200 env FLASHSCAN_SM90_BWD=1 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sm90_bwd_small.py --deterministic
  done ) &
wait
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/logs/san-*.log
left=$(( 590 - ($(date +%s) - START) )); echo "bench limit ${left}s"
run detab $left python3 .dev/det_ab2.py
grep "^|" $OUT/logs/detab.log; grep -v "^|" $OUT/logs/detab.log | tail -8
