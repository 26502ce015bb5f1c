#!/bin/bash
# stop 32 call 6: e (= main's kernels, 97253ab): ncu (full + source counters) of ssd2_chunk_state and
# ssd2_state_passing at b8 L2048 (what holds the chunk states now that neither their L2 traffic nor
# their step's barriers did: leads for the next stop).
R=$(pwd); O=$OUT/s32f; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-e .dev/wheel-e/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32f.tgz s32f && rm -rf s32f; }
trap fin EXIT
for k in ssd2_chunk_state ssd2_state_passing; do
echo "== ncu $k ($((SECONDS-T0)) s)" >> $S
run e 150 ncu --profile-from-start off --set full --import-source yes --section SourceCounters -k regex:"^$k\$" -c 1 -o $O/ncu_$k python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $O/ncu_$k.log 2>&1
run e 30 ncu --import $O/ncu_$k.ncu-rep --print-summary none > $O/ncu_$k.txt 2>&1
run e 60 ncu --import $O/ncu_$k.ncu-rep --page source --print-source sass --csv > $O/ncu_${k}_src.csv 2>&1
gzip $O/ncu_${k}_src.csv; rm -f $O/ncu_$k.ncu-rep
grep -E "Duration|Issue Slots Busy|Executed Instructions  |L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput" $O/ncu_$k.txt >> $S
done
