#!/bin/bash
# call 3: channel-first backward variants A/B (register prefetch at 8 blocks, none at 10, cp.async ring at 10 / 12), tests, peer
for w in cf8 np10 ring10 ring12; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat .dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
for w in ring10 ring12; do echo "== tests $w"; run $w 300 python3 -m pytest -q -x tests/test_conv_gpu.py -n 6 -p no:cacheprovider 2>&1 | tail -2; done
for t in memcheck racecheck synccheck; do
  echo "== $t ring10"; run ring10 200 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv 2>&1 | tail -3
done
echo "== A/B"
for w in cf8 ring10 ring12 np10 ring10 cf8 ring12 np10; do run $w 200 python3 tools/conv1d_profile.py $w 2>&1 | grep " cf:"; done
echo "== peer"
run ring10 300 python3 tools/conv1d_profile.py ring10 --peer .peers/causal-conv1d .dev/peer-cc 2>&1 | grep -v -i warn
echo "== bench"
run ring10 400 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench 2>&1 | tail -40
