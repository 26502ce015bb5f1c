#!/usr/bin/env bash
# stop 34 call 5: the persistent TMA forward against the one-tile grid and cuDNN, interleaved in one
# process (wheel p: FLASHSCAN_SM90_PERSIST read on every call), twice
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-p .dev/wheel-p/flashscan-*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-p/COMMIT | tee $L/info.txt
cd ${TMPDIR}
for r in 1 2; do
  PYTHONPATH=${TMPDIR}/site-p FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-p timeout 200 python3 $repo/.dev/scripts/attn_ab.py > $L/ab-$r.jsonl 2> $L/ab-$r.err; echo "ab $r rc $?"
  python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(f\"{r['shape']:22s} persistent {r['persistent_tflops']:6.1f} one-tile {r['one_tile_tflops']:6.1f} cudnn {r['cudnn_tflops']:6.1f}  p/1t {r['persistent_tflops']/r['one_tile_tflops']:.3f}  p/cudnn {r['persistent_tflops']/r['cudnn_tflops']:.3f}  {r['persistent_all']} {r['one_tile_all']} {r['cudnn_all']}\")
" $L/ab-$r.jsonl
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
