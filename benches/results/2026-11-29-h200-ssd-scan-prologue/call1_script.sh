#!/bin/bash
# stop 32 call 1: main aac18c4 (wheel r): ncu (full + source counters) of the wgmma ssd2_chunk_scan at
# b8 L2048: is it held by L2 traffic (~2.3 GB a call: CB fp32 0.82, x 0.41, H 0.33, C 0.33, z 0.17) or
# by latency? And the 2k forward profile.
R=$(pwd); O=$OUT/s32a; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-r .dev/wheel-r/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32a.tgz s32a && rm -rf s32a; }
trap fin EXIT
echo "== profile ($((SECONDS-T0)) s)" >> $S
run r 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only > $O/prof_2k_r.txt 2>&1
cat $O/prof_2k_r.txt | head -40 >> $S
echo "== ncu ($((SECONDS-T0)) s)" >> $S
run r 200 ncu --profile-from-start off --set full --import-source yes --section SourceCounters -k regex:"^ssd2_chunk_scan$" -c 1 -o $O/ncu_scan python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $O/ncu_scan.log 2>&1
run r 30 ncu --import $O/ncu_scan.ncu-rep --print-summary none > $O/ncu_scan.txt 2>&1
run r 60 ncu --import $O/ncu_scan.ncu-rep --page source --print-source sass --csv > $O/ncu_scan_src.csv 2>&1
run r 30 ncu --import $O/ncu_scan.ncu-rep --page raw --csv > $O/ncu_scan_raw.csv 2>&1
gzip $O/ncu_scan_src.csv
rm -f $O/ncu_scan.ncu-rep
