#!/usr/bin/env bash
# stop 45 call 7: the SSD forward+backward (b8 L2048) with ssd2_chunk_state_pass (forward and the backward's recompute) and with the pair
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
rm -rf $T/site
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
for r in 1 2; do
  for sp in 1 0; do
    echo "=== FLASHSCAN_SSD_STATE_PASS=$sp run $r"
    FLASHSCAN_SSD_STATE_PASS=$sp timeout -s KILL 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $OUT/logs/fb_${sp}_$r.log 2>&1
    grep -E "^## |state|total" $OUT/logs/fb_${sp}_$r.log | head -20
  done
done
