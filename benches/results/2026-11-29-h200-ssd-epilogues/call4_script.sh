#!/bin/bash
# stop 30 call 4: ncu (full + source counters) of e3's (= 3f23013's kernels) ssd_bwd_chunk_dx16 and
# ssd2_chunk_scan at b8 L2048, for the record and the next stop's lead.
R=$(pwd); O=$OUT/s30d; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-e3 .dev/wheel-e3/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t30
for k in ssd_bwd_chunk_dx16 ssd2_chunk_scan; do
  echo "ncu $k ($((SECONDS-T0)) s)" >> $O/times.txt
  run e3 150 ncu --profile-from-start off --set full --section SourceCounters -k regex:"^$k\$" -c 1 -o $O/ncu_$k python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range step > $O/ncu_$k.log 2>&1
  run e3 30 ncu --import $O/ncu_$k.ncu-rep --print-summary none > $O/ncu_$k.txt 2>&1
  run e3 30 ncu --import $O/ncu_$k.ncu-rep --page source --print-source sass --csv > $O/ncu_${k}_src.csv 2>&1
  rm -f $O/ncu_$k.ncu-rep
done
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s30d.tgz s30d && rm -rf s30d
