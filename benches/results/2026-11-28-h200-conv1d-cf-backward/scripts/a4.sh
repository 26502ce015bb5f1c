#!/bin/bash
# call 4: the committed channel-first backward (final = 10 blocks, no prefetch): tests, sanitizers,
# A/B against the head and a 12-block build, peer, bench; the sm90 backward matrix on the seeded conftest
for w in head final np12; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat .dev/wheel-$w/COMMIT | tr -d '\n')" "$@"; }
export PYTHONUNBUFFERED=1
echo "== tests final"; run final 300 python3 -m pytest -q tests/test_conv_gpu.py -n 6 -p no:cacheprovider 2>&1 | tail -2
echo "== tests np12"; run np12 300 python3 -m pytest -q tests/test_conv_gpu.py -n 6 -p no:cacheprovider 2>&1 | tail -2
echo "== sm90 matrix + seed replay (final)"; run final 300 python3 -m pytest -q tests/test_backward_gpu.py -k "sm90" -n 6 -p no:cacheprovider 2>&1 | tail -2
FLASHSCAN_TEST_SEED=77 run final 200 python3 -m pytest -q -s tests/test_backward_gpu.py -k "sm90_matrix and b2-q7-k7-h2/2-d64-bfloat16-c0" -p no:cacheprovider 2>&1 | grep -c "FLASHSCAN_TEST_SEED=77"
for t in memcheck racecheck synccheck; do echo "== $t final"; run final 200 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py conv 2>&1 | tail -2; done
echo "== A/B"
for w in head final np12 final np12 head; do run $w 200 python3 tools/conv1d_profile.py $w 2>&1 | grep " cf:"; done
echo "== peer"
run final 300 python3 tools/conv1d_profile.py final --peer .peers/causal-conv1d .dev/peer-cc 2>&1 | grep -v -i warn
echo "== bench"
run final 400 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench 2>&1 | tail -34
