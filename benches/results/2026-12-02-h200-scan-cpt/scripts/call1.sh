#!/usr/bin/env bash
# stop 34 call 1: the selective-scan forward with 2 / 4 channels a lane group (FS_CPT), wheel c
set -uo pipefail
TMPDIR=${TMPDIR:-/tmp}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-c .dev/wheel-c/flashscan-*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-c/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-c FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-c "$@"; }
SW=$repo/tools/scan_tile_sweep.py
for r in 1 2; do
  run timeout 150 python3 $SW --shapes rt32 --reps 50 --out $L/rt32_$r.jsonl --configs 8,16,128,4,2 4,16,128,4,2 4,16,64,8,2 8,32,128,4,2 8,16,128,4,4 16,32,128,4,2 16,32,128,4,4 8,16,64,8,2 > $L/rt32_$r.log 2>&1
  echo "rt32 round $r"; python3 -c "import json,sys; [print(' ', r['config'], r.get('kernel_us'), r.get('graph_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, open(sys.argv[1]))]" $L/rt32_$r.jsonl
done
for r in 1 2; do
  run timeout 120 python3 $SW --shapes rt16,rt1 --reps 50 --out $L/rt16_1_$r.jsonl --configs 16,32,128,4,2 8,32,128,4,2 16,64,128,4,2 8,16,128,4,2 16,32,128,4,4 16,64,64,8,2 > $L/rt16_1_$r.log 2>&1
  echo "rt16/rt1 round $r"; python3 -c "import json,sys; [print(' ', r['shape'], r['config'], r.get('kernel_us'), r.get('graph_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, open(sys.argv[1]))]" $L/rt16_1_$r.jsonl
done
run timeout 150 python3 $SW --shapes 2k --reps 10 --out $L/2k.jsonl --configs 8,32,128,4,2 8,16,128,4,2 4,32,128,4,2 8,32,256,2,2 > $L/2k.log 2>&1
echo "2k"; python3 -c "import json,sys; [print(' ', r['config'], r.get('kernel_us'), r.get('status'), r.get('max_rel_diff', r.get('error', r.get('stderr', '')))) for r in map(json.loads, open(sys.argv[1]))]" $L/2k.jsonl
for cfg in default 8,16,128,4,2; do
  tag=${cfg//,/_}
  if [ $cfg = default ]; then unset FLASHSCAN_SCAN_TILES; else export FLASHSCAN_SCAN_TILES=$cfg; fi
  run timeout 90 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy -k regex:selective_scan_fwd -s 2 -c 1 python3 $repo/.dev/scripts/rt_one.py 32 > $L/ncu_rt32_$tag.txt 2>&1
  echo "ncu $cfg: $(grep -E 'Duration|Issue Slots Busy|Executed Instructions  |Registers Per|Eligible Warps' $L/ncu_rt32_$tag.txt | tr -s ' ' | tr '\n' ';')"
done
unset FLASHSCAN_SCAN_TILES
cd $OUT && tar czf logs.tgz logs && rm -rf logs
