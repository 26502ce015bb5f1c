#!/usr/bin/env bash
# stop 45 call 2: ssd2_chunk_state_pass at 32 positions x 3 stages, 5 CTAs an SM (96 registers, 120 B stack); fp32 H_c too
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
run quick 150 python3 -m pytest tests/test_ssd_gpu.py -q -p no:cacheprovider -k fused_state_passing -x
grep -E "passed|failed|Error|error|assert" $OUT/logs/quick.log | head -20
grep -q " failed" $OUT/logs/quick.log && exit 0
for r in 1 2; do
  FLASHSCAN_SSD_STATE_PASS=0 run prof_pair_$r 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |state" $OUT/logs/prof_pair_$r.log
  run prof_fused_$r 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only
  grep -E "^## |state" $OUT/logs/prof_fused_$r.log
done
run prof_fused_8k 90 python3 tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only
grep -E "^## |state" $OUT/logs/prof_fused_8k.log
FLASHSCAN_SSD_STATE_PASS=0 run prof_pair_8k 90 python3 tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only
grep -E "^## |state" $OUT/logs/prof_pair_8k.log
run tests 250 python3 -m pytest tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -q -p no:cacheprovider -n 8
grep -E "passed|failed" $OUT/logs/tests.log | tail -12
