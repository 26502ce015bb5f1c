#!/usr/bin/env bash
# stop 33 call 1: fused state passing: GPU tests, sanitizers, A/B timing (PASS=0 vs default), Triton beside
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site .dev/wheel/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
export PYTHONPATH=${TMPDIR}/site:${TMPDIR}/site-deps
export FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache
repo=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/info.txt
cat .dev/wheel/COMMIT | tee -a $OUT/info.txt
# the GPU tests of the SSD (both files), fused and the new equality test
( cd /tmp && timeout 240 python3 -m pytest $repo/tests/test_ssd_gpu.py $repo/tests/test_ssd.py -m gpu -q -p no:cacheprovider -n 8 -x > $OUT/tests.log 2>&1; echo "tests rc $?" >> $OUT/tests.log )
tail -5 $OUT/tests.log
# sanitizers over the SSD cases
for tool in memcheck racecheck synccheck; do
  ( cd /tmp && timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/tools/sanitize_cases.py ssd ssd_fwd2 > $OUT/san-$tool.log 2>&1; echo "rc $?" >> $OUT/san-$tool.log )
  echo "$tool: $(tail -3 $OUT/san-$tool.log | tr '\n' ' ')"
done
# A/B timing, alternated
cd /tmp
for rep in 1 2; do
  for mode in 0 1; do
    FLASHSCAN_SSD_PASS=$mode timeout 150 python3 $repo/tools/ssd_profile.py --shape 2k --paths 2 --reps 5 > $OUT/prof-2k-pass$mode-r$rep.log 2>&1
  done
done
for mode in 0 1; do
  FLASHSCAN_SSD_PASS=$mode timeout 150 python3 $repo/tools/ssd_profile.py --shape 8k --paths 2 --reps 3 --fwd-only > $OUT/prof-8k-pass$mode.log 2>&1
done
timeout 200 python3 $repo/tools/ssd_profile.py --shape 2k --paths 2 --reps 5 --fwd-only --mamba-src $repo/.dev/peers/mamba > $OUT/prof-2k-triton.log 2>&1
echo done
