#!/usr/bin/env bash
# stop 33 call 2: the failing case verbose; SSD GPU tests; sanitizers; A/B timing
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site .dev/wheel/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
export PYTHONPATH=${TMPDIR}/site:${TMPDIR}/site-deps
export FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel/COMMIT | tee $L/info.txt
cd /tmp
for mode in 1 0; do for s in 1 2 3; do
  FLASHSCAN_SSD_PASS=$mode FLASHSCAN_TEST_SEED=$s timeout 60 python3 -m pytest "$repo/tests/test_ssd_gpu.py::test_backward_matrix[bwd2-float16-2-17-30-77-64-True]" -q -p no:cacheprovider > $L/bm-$mode-$s.log 2>&1
  echo "bm pass=$mode seed=$s: $(tail -1 $L/bm-$mode-$s.log)"
done; done
timeout 200 python3 -m pytest $repo/tests/test_ssd_gpu.py $repo/tests/test_ssd.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests.log 2>&1; echo "tests rc $?" >> $L/tests.log
tail -4 $L/tests.log
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/tools/sanitize_cases.py ssd ssd_fwd2 > $L/san-$tool.log 2>&1; echo "rc $?" >> $L/san-$tool.log
  echo "$tool: $(tail -3 $L/san-$tool.log | tr '\n' ' ')"
done
for rep in 1 2; do for mode in 0 1; do
  FLASHSCAN_SSD_PASS=$mode timeout 100 python3 $repo/tools/ssd_profile.py --shape 2k --paths 2 --reps 5 --fwd-only > $L/prof-2k-pass$mode-r$rep.log 2>&1
  echo "2k pass=$mode: $(grep -E 'SSD forward 2k|chunk_state|state_passing' $L/prof-2k-pass$mode-r$rep.log | tr '\n' ' ')"
done; done
for mode in 0 1; do
  FLASHSCAN_SSD_PASS=$mode timeout 100 python3 $repo/tools/ssd_profile.py --shape 8k --paths 2 --reps 3 --fwd-only > $L/prof-8k-pass$mode.log 2>&1
  echo "8k pass=$mode: $(grep -E 'SSD forward 8k|chunk_state|state_passing' $L/prof-8k-pass$mode.log | tr '\n' ' ')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
