#!/bin/bash
# stop 29 call 2: wheel a (conv1d short walks: packed weights, interior path, int only) against m;
# conv GPU tests + memcheck on a; ncu of a's short walks; causal-conv1d built in the background
R=$(pwd); O=$OUT/s29b; mkdir -p $O
for w in m a; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t29b
( run m 560 python3 -c "from flashscan.bench import conv1d_src; i = conv1d_src.load('.dev/peers/causal-conv1d', '${TMPDIR}/peer-cc', print); print('ERR', i['error'], i['build_s'])" > $O/peer_build.log 2>&1 ) &
BPID=$!
echo "tests a ($((SECONDS-T0)) s)" >> $O/times.txt
run a 200 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_a.log 2>&1
echo "ab ($((SECONDS-T0)) s)" >> $O/times.txt
for r in 1 2; do for w in m a; do for s in "32 640 60" "1 640 60"; do
  echo "== $w round $r shape $s" >> $O/ab.log; run $w 60 python3 $T/tools/conv1d_profile.py $w --shape $s 2>&1 | grep -v -i warn >> $O/ab.log
done; done; done
echo "ncu ($((SECONDS-T0)) s)" >> $O/times.txt
S="--set full --section SourceCounters --import-source no"
for k in causal_conv1d_fwd_cl_short causal_conv1d_bwd_cl_short; do
  run a 90 ncu --clock-control none --kernel-name regex:"^$k" --launch-skip 3 --launch-count 1 $S -o $O/ncu_a_$k python3 $T/tools/conv1d_profile.py ncu --shape 32 640 60 > $O/ncu_a_$k.log 2>&1
  run a 30 ncu --import $O/ncu_a_$k.ncu-rep --print-summary none > $O/ncu_a_$k.txt 2>&1
  run a 30 ncu --import $O/ncu_a_$k.ncu-rep --page source --print-source sass --csv > $O/ncu_a_${k}_src.csv 2>&1
  rm -f $O/ncu_a_$k.ncu-rep
done
echo "memcheck ($((SECONDS-T0)) s)" >> $O/times.txt
run a 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py conv > $O/memcheck_a.log 2>&1; echo "rc $?" >> $O/memcheck_a.log
echo "wait build ($((SECONDS-T0)) s)" >> $O/times.txt
wait $BPID
echo "built ($((SECONDS-T0)) s)" >> $O/times.txt
if [ -f ${TMPDIR}/peer-cc/causal_conv1d_cuda.so ]; then
  mkdir -p ${TMPDIR}/peer-carry && cp ${TMPDIR}/peer-cc/causal_conv1d_cuda.so ${TMPDIR}/peer-carry/ && strip --strip-unneeded ${TMPDIR}/peer-carry/causal_conv1d_cuda.so
  ls -la ${TMPDIR}/peer-carry >> $O/times.txt
  gzip -c ${TMPDIR}/peer-carry/causal_conv1d_cuda.so > $OUT/causal_conv1d_cuda.so.gz
  for w in m a; do run $w 60 python3 $T/tools/conv1d_profile.py $w --peer .dev/peers/causal-conv1d ${TMPDIR}/peer-carry --shape 32 640 60 2>&1 | grep -v -i warn >> $O/peer_prof.log; done
fi
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s29b.tgz s29b && rm -rf s29b
