#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
FLASHSCAN_SM90_PERSIST=0 timeout 200 ncu --section WarpStateStats --section SourceCounters --print-details all -k regex:flash_fwd_sm90_tma -s 0 -c 1 python3 .dev/fp8_one.py > $OUT/logs/ncu_fp8.txt 2>&1; echo "fp8 rc=$?"
FLASHSCAN_SM90_PERSIST=0 timeout 200 ncu --section WarpStateStats --section SourceCounters --print-details all -k regex:flash_fwd_sm90_tma -s 1 -c 1 python3 .dev/fp8_one.py > $OUT/logs/ncu_bf16.txt 2>&1; echo "bf16 rc=$?"
grep -i "stall\|Warp Cycles" $OUT/logs/ncu_fp8.txt | head -60
