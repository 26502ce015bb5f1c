#!/bin/bash
# stop 27 call 6: the landed forward (9291537) beside mamba_ssm's CUDA scan built from e9594ce
R=$(pwd); O=$OUT/s27f; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-f .dev/wheel-f/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" MAX_JOBS=16 "$@"; }
cp -r .dev/peers/mamba ${TMPDIR}/mamba
run f 250 python3 -m flashscan bench --quick --suite scan --no-plots --mamba-src ${TMPDIR}/mamba --out $O/bench > $O/bench.log 2>&1; echo "rc $?" >> $O/bench.log
cd $OUT && tar czf s27f.tgz s27f && rm -rf s27f
