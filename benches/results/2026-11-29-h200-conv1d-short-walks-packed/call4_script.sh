#!/bin/bash
# stop 29 call 4: the head h (151ca5e): conv GPU tests, racecheck / synccheck / memcheck over the conv cases,
# the conv1d bench (--quick) beside causal-conv1d (prebuilt .so carried), real-time profiles of m and h beside it
R=$(pwd); O=$OUT/s29d; mkdir -p $O
for w in m h; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t29h; P=".dev/peers/causal-conv1d .dev/peer-cc"
echo "tests h ($((SECONDS-T0)) s)" >> $O/times.txt
run h 200 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_h.log 2>&1
echo "bench ($((SECONDS-T0)) s)" >> $O/times.txt
run h 200 python3 $T/benches/conv1d.py --quick --conv1d-src .dev/peers/causal-conv1d --conv1d-build .dev/peer-cc --out $O/bench_h > $O/bench_h.log 2>&1; echo "rc $?" >> $O/bench_h.log
echo "profiles ($((SECONDS-T0)) s)" >> $O/times.txt
for r in 1 2; do for w in m h; do for s in "32 640 60" "1 640 60"; do
  echo "== $w round $r shape $s" >> $O/prof.log; run $w 60 python3 $T/tools/conv1d_profile.py $w --peer $P --shape $s 2>&1 | grep -v -i warn | grep " cl:" >> $O/prof.log
done; done; done
for t in memcheck racecheck synccheck; do echo "$t ($((SECONDS-T0)) s)" >> $O/times.txt; run h 200 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py conv > $O/$t.log 2>&1; echo "rc $?" >> $O/$t.log; done
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s29d.tgz s29d && rm -rf s29d
