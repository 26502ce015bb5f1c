#!/bin/bash
# stop 30 call 2: the SSD chunk scan's epilogue. m = main 260e10f, e2 = 504e798 (D staged in shared
# memory, loaded in the W x loop's first iteration; shared reads issued first; has_z / full-tile
# tests outside the element loops), e1 = e2 with D loaded into a register before the loop (spills 8 B
# at chunk 64 under NVRTC 13.0). Predicted scan 416 -> ~360-370 us (the epilogue was ~25% of the
# stall samples).
R=$(pwd); O=$OUT/s30b; mkdir -p $O
for w in m e1 e2; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t30; S=$O/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $S
ab() { for w in m e1 e2; do
  echo "-- $w r$1"
  run $w 60 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD forward|chunk_scan" $O/prof_2k_${w}_$1.txt
  run $w 40 python3 $T/tools/ssd_profile.py --shape rt --reps 8 --paths 2 --fwd-only > $O/prof_rt_${w}_$1.txt 2>&1
  grep -E "^## SSD forward|chunk_scan" $O/prof_rt_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== e2 ssd tests ($((SECONDS-T0)) s)" >> $S
run e2 200 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_e2.txt 2>&1; echo "rc $?" >> $O/tests_ssd_e2.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_e2.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
for t in memcheck racecheck; do echo "== $t e2 ($((SECONDS-T0)) s)" >> $S; run e2 90 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
echo "== ncu e2 ($((SECONDS-T0)) s)" >> $S
run e2 120 ncu --profile-from-start off --set full --section SourceCounters -k regex:ssd2_chunk_scan -c 1 -o $O/ncu_scan_e2 python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $O/ncu_scan_e2.log 2>&1
run e2 30 ncu --import $O/ncu_scan_e2.ncu-rep --print-summary none > $O/ncu_scan_e2.txt 2>&1
run e2 30 ncu --import $O/ncu_scan_e2.ncu-rep --page source --print-source sass --csv > $O/ncu_scan_e2_src.csv 2>&1
rm -f $O/ncu_scan_e2.ncu-rep
echo "done ($((SECONDS-T0)) s)" >> $S
cd $OUT && tar czf s30b.tgz s30b && rm -rf s30b
