#!/bin/bash
# stop 22 call 5: the whole GPU suite on the final wheel (d3e9596), then the conv1d bench beside causal-conv1d
pip install -q --no-deps --no-index --target ${TMPDIR}/site-final .dev/wheel-final/*.whl 2>/dev/null
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
echo "== final suite" | tee $OUT/d5.txt
(cd /tmp && run final 280 python3 -m pytest $R/tests -m gpu -n 8 -q -p no:cacheprovider > $OUT/suite_final.txt 2>&1; echo "rc $?" >> $OUT/suite_final.txt)
grep -E "FAILED|ERROR|passed|failed|^rc" $OUT/suite_final.txt | head -20 | tee -a $OUT/d5.txt
echo "== bench ($((SECONDS-T0)) s)" | tee -a $OUT/d5.txt
run final 60 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench > $OUT/bench.log 2>&1; grep -E "^\| (fwd|upd)" $OUT/bench.log | grep flashscan | tee -a $OUT/d5.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/d5.txt
