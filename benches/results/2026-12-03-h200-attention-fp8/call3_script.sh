#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$(date +%s)
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 12 "$OUT/logs/$name.log"; }
run small 120 python3 tools/fp8_small.py
( run tests 240 python3 -m pytest tests/test_fp8_gpu.py tests/test_fp8.py -q -p no:cacheprovider -n 4 --maxfail=30 ) &
( for tool in memcheck racecheck; do
    run "san-$tool" 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/fp8_small.py
  done ) &
wait
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/logs/san-*.log

left=$(( 585 - ($(date +%s) - START) )); echo "bench limit ${left}s"
run bench $left python3 benches/fp8_attention.py --rounds 2
