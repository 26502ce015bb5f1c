#!/bin/bash
# call 6: the channel-first backward with compile-time SiLU and a vector-only loop for full aligned blocks
for w in final fast; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat .dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
echo "== tests fast"; run fast 120 python3 -m pytest -q tests/test_conv_gpu.py -n 8 -p no:cacheprovider 2>&1 | tail -2
for t in memcheck racecheck; do echo "== $t fast"; run fast 90 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv 2>&1 | tail -2; done
echo "== A/B"
for w in final fast final fast; do run $w 60 python3 tools/conv1d_profile.py $w 2>&1 | grep " cf:\| cl:"; done
echo "== peer"
run fast 90 python3 tools/conv1d_profile.py fast --peer .peers/causal-conv1d .dev/peer-cc 2>&1 | grep -v -i warn
S="--section SpeedOfLight --section Occupancy --section SchedulerStats --section InstructionStats"
echo "== ncu fast"; run fast 60 ncu --clock-control none --kernel-name causal_conv1d_bwd_cf --launch-skip 3 --launch-count 1 $S python3 tools/conv1d_profile.py ncu > $OUT/ncu_fast.txt 2>&1
grep -E "Duration|DRAM Throughput|Issue Slots|Executed Instructions  |Achieved Occupancy" $OUT/ncu_fast.txt
