#!/usr/bin/env bash
# stop 37 call 6 (wheel poly = 159c7f0 + FS_EXP_POLY, part of the softmax's exps on the FMA pipe,
# through FLASHSCAN_SM90_EXP_POLY, then a dev-only name): the A/B sweep against POLY=0 in one process,
# then the TMA GPU tests with POLY=2 on every variant
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
w=poly
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-$w/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run timeout 75 python3 $repo/benches/results/2026-12-02-h200-attention-exp-fma/scripts/poly_sweep.py --shapes 64:2048:0,64:2048:1,64:8192:0,64:2048:0:50 --polys 0,2,4 > $L/sweep.jsonl 2> $L/sweep.err; echo "sweep rc $?"; tail -3 $L/sweep.err
python3 - $L/sweep.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    ps = " ".join(f"{k}={v}" for k, v in r.items() if k.startswith("poly") and not k.endswith("_all"))
    d = " ".join(f"{k}:{v:.0e}" for k, v in r["max|diff vs poly0|"].items())
    print(f"  {r['shape']:28s} {ps} cudnn {r['cudnn_nocap']} | {d}")
PY
run env FLASHSCAN_SM90_EXP_POLY=2 timeout 70 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py -m gpu -q -p no:cacheprovider -n 8 -x > $L/tests-poly2.log 2>&1; echo "tests poly2 rc $?"; tail -1 $L/tests-poly2.log
grep -h "FAIL" $L/tests-poly2.log | head -6
