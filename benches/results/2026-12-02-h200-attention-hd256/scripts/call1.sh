#!/usr/bin/env bash
# stop 37 call 1 (wheel hd256 = 5a4ee23 + head dim 256 on the TMA kernel + dev A/B switches):
# TMA GPU tests (hd256 cases), memcheck / racecheck of small hd256 cases, the sweep
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
w=hd256
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-$w/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version --format=csv >> $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
# warm the cache for the sanitizers (one compile, not under the sanitizer)
run timeout 120 python3 $repo/benches/results/2026-12-02-h200-attention-hd256/scripts/hd256_small.py > $L/small-plain.log 2>&1; echo "small rc $?"; cat $L/small-plain.log
for tool in memcheck racecheck synccheck; do
  run timeout -s KILL 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/benches/results/2026-12-02-h200-attention-hd256/scripts/hd256_small.py > $L/san-$tool.log 2>&1 &
done
run timeout 300 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-tma.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-tma.log
grep -h "FAIL" $L/tests-tma.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|ALL OK\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
run timeout 280 python3 $repo/benches/results/2026-12-02-h200-attention-hd256/scripts/hd256_sweep.py --rounds 3 --shapes 256:512:0,256:512:1,256:2048:0,256:2048:1,256:8192:0,256:8192:1,256:16384:0,256:16384:1,256:4096:0:fp16,192:2048:0,192:2048:1,192:8192:0,136:2048:1 > $L/sweep.jsonl 2> $L/sweep.err; echo "sweep rc $?"; tail -3 $L/sweep.err
python3 - $L/sweep.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    d = " ".join(f"{k}:{v:.0e}" for k, v in r["max|tma-mma|"].items())
    print(f"  {r['shape']:30s} mma {r['mma']:6.1f} pp {r['pingpong']:6.1f} pipe {r['pipe']:6.1f} plain {r['plain']:6.1f} cudnn {r['cudnn']:6.1f} fa2 {r['fa2']:6.1f} | {d}")
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
