#!/usr/bin/env bash
# the softcap A/B again, with dynamo's recompile limit raised (call 1's hd256 flex rows ran unfused)
set -u; T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl || exit 1
mkdir -p $OUT/logs
PYTHONUNBUFFERED=1 PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache timeout 560 python3 .dev/cap_ab.py > $OUT/logs/capab2.log 2>&1
echo rc=$?; grep "^|" $OUT/logs/capab2.log
