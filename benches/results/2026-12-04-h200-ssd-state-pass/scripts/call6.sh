#!/usr/bin/env bash
# stop 45 call 6: ssd2_chunk_state_pass_mc (clusters of four sharing B by TMA multicast): tests, A/B against the single-CTA form and the pair, SSD GPU tests, sanitizers
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
rm -rf $T/site
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 2 "$OUT/logs/$name.log"; }
run quick 150 python3 -m pytest tests/test_ssd_gpu.py -q -p no:cacheprovider -n 4 -k fused_state_passing
grep -E "passed|failed|Error|assert" $OUT/logs/quick.log | head -20
grep -q " failed" $OUT/logs/quick.log && exit 0
for r in 1 2; do
  run prof_mc_$r 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |state" $OUT/logs/prof_mc_$r.log
  FLASHSCAN_SSD_STATE_CLUSTER=1 run prof_single_$r 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |state" $OUT/logs/prof_single_$r.log
done
FLASHSCAN_SSD_STATE_PASS=0 run prof_pair 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
grep -E "^## |state" $OUT/logs/prof_pair.log
run prof_mc_8k 60 python3 tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only
grep -E "^## |state" $OUT/logs/prof_mc_8k.log
cat $OUT/logs/prof_*.log > $OUT/profiles.log; rm $OUT/logs/prof_*.log
run tests 200 python3 -m pytest tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -q -p no:cacheprovider -n 8
grep -E "passed|failed" $OUT/logs/tests.log | tail -8
for t in memcheck racecheck; do
  run $t 120 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd_fwd2
done
