#!/usr/bin/env bash
# stop 33 call 4: ssd2_state_passing's cp.async ring (n = c63b891) against main (r = a9068f3)
set -uo pipefail
export PYTHONUNBUFFERED=1
for w in r n; do python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-$w .dev/wheel-$w/flashscan-*.whl || exit 1; done
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-r/COMMIT .dev/wheel-n/COMMIT | tee $L/info.txt
cd /tmp
run() { w=$1; shift; PYTHONPATH=${TMPDIR}/site-$w:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w "$@"; }
run n timeout 200 python3 -m pytest $repo/tests/test_ssd_gpu.py $repo/tests/test_ssd.py $repo/tests/test_ssd_fwd2_model.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-n.log 2>&1; echo "tests rc $?" >> $L/tests-n.log
tail -3 $L/tests-n.log
for tool in memcheck racecheck; do
  run n timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $repo/tools/sanitize_cases.py ssd ssd_fwd2 > $L/san-$tool-n.log 2>&1; echo "rc $?" >> $L/san-$tool-n.log
  echo "$tool: $(tail -3 $L/san-$tool-n.log | tr '\n' ' ')"
done
for rep in 1 2; do for w in r n; do
  run $w timeout 100 python3 $repo/tools/ssd_profile.py --shape 2k --paths 2 --reps 5 --fwd-only > $L/prof-2k-$w-r$rep.log 2>&1
  echo "2k $w: $(grep -E 'SSD forward 2k|chunk_state|state_passing' $L/prof-2k-$w-r$rep.log | tr '\n' ' ')"
done; done
for w in r n; do
  run $w timeout 100 python3 $repo/tools/ssd_profile.py --shape 8k --paths 2 --reps 3 --fwd-only > $L/prof-8k-$w.log 2>&1
  echo "8k $w: $(grep -E 'SSD forward 8k|state_passing' $L/prof-8k-$w.log | tr '\n' ' ')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
