#!/bin/bash
# stop 29 call 3: wheel b (a + the forward short walk at 5 blocks an SM: 4 positions a warp at b32)
# against a and m; b's conv GPU tests; causal-conv1d rebuilt in the background and brought back in parts
R=$(pwd); O=$OUT/s29c; mkdir -p $O
for w in m a b; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t29b
( run m 560 python3 -c "from flashscan.bench import conv1d_src; i = conv1d_src.load('.dev/peers/causal-conv1d', '${TMPDIR}/peer-cc', print); print('ERR', i['error'], i['build_s'])" > $O/peer_build.log 2>&1 ) &
BPID=$!
echo "tests b ($((SECONDS-T0)) s)" >> $O/times.txt
run b 200 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_b.log 2>&1
echo "ab ($((SECONDS-T0)) s)" >> $O/times.txt
for r in 1 2; do for w in m a b; do for s in "32 640 60" "1 640 60" "16 640 60" "8 1280 60"; do
  echo "== $w round $r shape $s" >> $O/ab.log; run $w 60 python3 $T/tools/conv1d_profile.py $w --shape $s 2>&1 | grep -v -i warn | grep " cl:" >> $O/ab.log
done; done; done
echo "ncu ($((SECONDS-T0)) s)" >> $O/times.txt
S="--set full --section SourceCounters --import-source no"
for k in causal_conv1d_fwd_cl_short; do
  run b 90 ncu --clock-control none --kernel-name regex:"^$k" --launch-skip 3 --launch-count 1 $S -o $O/ncu_b_$k python3 $T/tools/conv1d_profile.py ncu --shape 32 640 60 > $O/ncu_b_$k.log 2>&1
  run b 30 ncu --import $O/ncu_b_$k.ncu-rep --print-summary none > $O/ncu_b_$k.txt 2>&1
  run b 30 ncu --import $O/ncu_b_$k.ncu-rep --page source --print-source sass --csv > $O/ncu_b_${k}_src.csv 2>&1
  rm -f $O/ncu_b_$k.ncu-rep
done
echo "memcheck ($((SECONDS-T0)) s)" >> $O/times.txt
run b 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py conv > $O/memcheck_b.log 2>&1; echo "rc $?" >> $O/memcheck_b.log
echo "wait build ($((SECONDS-T0)) s)" >> $O/times.txt
wait $BPID
echo "built ($((SECONDS-T0)) s)" >> $O/times.txt
if [ -f ${TMPDIR}/peer-cc/causal_conv1d_cuda.so ]; then
  mkdir -p ${TMPDIR}/peer-carry && cp ${TMPDIR}/peer-cc/causal_conv1d_cuda.so ${TMPDIR}/peer-carry/ && strip --strip-unneeded ${TMPDIR}/peer-carry/causal_conv1d_cuda.so
  sha256sum ${TMPDIR}/peer-carry/causal_conv1d_cuda.so > $OUT/peer_so.sha256
  gzip -9 -c ${TMPDIR}/peer-carry/causal_conv1d_cuda.so | split -b 15m - $OUT/peer_so.gz.part-
  ls -la $OUT >> $O/times.txt
  for w in m a b; do for s in "32 640 60" "1 640 60"; do run $w 60 python3 $T/tools/conv1d_profile.py $w --peer .dev/peers/causal-conv1d ${TMPDIR}/peer-carry --shape $s 2>&1 | grep -v -i warn | grep " cl:" >> $O/peer_prof.log; done; done
fi
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s29c.tgz s29c && rm -rf s29c
