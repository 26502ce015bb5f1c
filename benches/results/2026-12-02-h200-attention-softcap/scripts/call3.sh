#!/usr/bin/env bash
# stop 37 call 3 (wheel capdev = 1bae722 + softcap on the TMA forward + dev A/B switches): the
# attention GPU tests (TMA with softcap cases, forward matrix, backward), sanitizers over small
# softcap cases, the softcap sweep (mma.sync vs TMA, flex_attention and cuDNN beside)
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
w=capdev
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-$w/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run timeout 120 python3 $repo/benches/results/2026-12-02-h200-attention-softcap/scripts/softcap_small.py > $L/small-plain.log 2>&1; echo "small rc $?"; cat $L/small-plain.log
for tool in memcheck racecheck synccheck; do
  run timeout -s KILL 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/benches/results/2026-12-02-h200-attention-softcap/scripts/softcap_small.py > $L/san-$tool.log 2>&1 &
done
run timeout 300 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests.log 2>&1; echo "tests rc $?"; tail -2 $L/tests.log
grep -h "FAIL" $L/tests.log | head -8
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|ALL OK\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
run timeout 300 python3 $repo/benches/results/2026-12-02-h200-attention-softcap/scripts/softcap_sweep.py --rounds 3 --shapes 64:2048:0,64:2048:1,64:8192:0,128:2048:0,128:2048:1,128:8192:0,128:8192:1,256:2048:0,256:8192:1 --flex 64:2048:0,128:2048:0,128:2048:1,256:2048:0 > $L/sweep.jsonl 2> $L/sweep.err; echo "sweep rc $?"; tail -3 $L/sweep.err
python3 - $L/sweep.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"):
        print(l.strip()); continue
    r = json.loads(l)
    print(f"  {r['shape']:24s} mma_cap {r['mma_cap']:6.1f} tma_cap {r['tma_cap']:6.1f} ({r['tma_cap']/r['mma_cap']:.2f}x) tma_nocap {r['tma_nocap']:6.1f} cudnn_nocap {r['cudnn_nocap']:6.1f} flex_cap {r.get('flex_cap', float('nan')):6.1f} diff {r['max|tma-mma|']:.0e}")
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
