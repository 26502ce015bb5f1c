#!/usr/bin/env bash
# stop 37 call 4 (wheel vardev = 8269fe9 + varlen on the TMA forward + dev A/B switches; wheel
# cap1 = 8269fe9's code): TMA / varlen / attention GPU tests, sanitizers over small varlen cases,
# the varlen sweep (mma.sync vs TMA in one process), benches/varlen.py, dense A/B of the two wheels
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in vardev cap1; do
  python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1
done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-vardev/COMMIT .dev/wheel-cap1/COMMIT | tee $L/info.txt
cd ${TMPDIR}
runw() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
runw vardev timeout 120 python3 $repo/benches/results/2026-12-02-h200-attention-varlen-tma/scripts/varlen_small.py > $L/small-plain.log 2>&1; echo "small rc $?"; cat $L/small-plain.log
for tool in memcheck racecheck synccheck; do
  runw vardev timeout -s KILL 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/benches/results/2026-12-02-h200-attention-varlen-tma/scripts/varlen_small.py > $L/san-$tool.log 2>&1 &
done
runw vardev timeout 330 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_varlen_gpu.py $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests.log 2>&1; echo "tests rc $?"; tail -2 $L/tests.log
grep -h "FAIL" $L/tests.log | head -12
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|ALL OK\|FAIL' $f | tr '\n' ' ' | cut -c1-300)"; done
runw vardev timeout 200 python3 $repo/benches/results/2026-12-02-h200-attention-varlen-tma/scripts/varlen_sweep.py --shapes 64:0,64:1,128:0,128:1,256:0,256:1 > $L/sweep.jsonl 2> $L/sweep.err; echo "sweep rc $?"; tail -3 $L/sweep.err
python3 - $L/sweep.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"  {r['shape']:44s} mma {r['mma']:6.1f} tma {r['tma']:6.1f} ({r['tma']/r['mma']:.2f}x) dense-equal {r['dense_tma_equal']:6.1f} diff {r['max|tma-mma|']:.0e}")
PY
for i in 1 2; do for w in cap1 vardev; do
  runw $w timeout 60 python3 $repo/benches/results/2026-12-02-h200-attention-varlen-tma/scripts/dense_ab.py 64:2048:0,64:2048:1,128:2048:0,128:2048:1,256:2048:0,128:512:1 > $L/ab-$w-$i.jsonl 2>&1
  echo "$w $i: $(python3 -c "import json,sys; print(' '.join(f\"{json.loads(l)['shape']}={json.loads(l)['tflops']}\" for l in open(sys.argv[1])))" $L/ab-$w-$i.jsonl)"
done; done
runw vardev timeout 150 python3 $repo/benches/varlen.py --quick > $L/bench-varlen.log 2>&1; echo "bench varlen rc $?"; tail -12 $L/bench-varlen.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
