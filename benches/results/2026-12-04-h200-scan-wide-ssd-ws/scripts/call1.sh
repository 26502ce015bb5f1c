#!/usr/bin/env bash
# stop 44 call 1: scan forward 256-thread blocks (wave-fill lead), SSD forward baseline beside Triton
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 2 "$OUT/logs/$name.log"; }
show() { python3 -c "import json,sys; [print(' ', r['shape'], r['config'], r.get('kernel_us'), r.get('graph_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, open(sys.argv[1]))]" $1; }
SW=tools/scan_tile_sweep.py
run big 260 python3 $SW --shapes 2k,8k,16k --reps 10 --out $OUT/logs/big.jsonl --configs 4,32,256,2 8,32,256,2 4,32,128,4 4,16,256,2 4,32,256,2 8,32,256,4
show $OUT/logs/big.jsonl
run ssd 200 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only --mamba-src .dev/peers/mamba
grep -E "^## |chunk_scan|chunk_state|state_passing|chunk_cb|prep|total|bmm|cumsum" $OUT/logs/ssd.log | head -40
