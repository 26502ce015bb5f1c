#!/usr/bin/env bash
# the varlen A/B again with one offsets tensor for the SDPA jagged peer (call 1's peer rows failed:
# separately built offsets gave out and dout different ragged sizes)
set -u; T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl || exit 1
mkdir -p $OUT/logs
PYTHONUNBUFFERED=1 PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache timeout 400 python3 .dev/varlen_ab.py > $OUT/logs/varlenab2.log 2>&1
echo rc=$?; grep "^|" $OUT/logs/varlenab2.log
