#!/bin/bash
# stop 31 call 4: d = c + ssd2_chunk_scan on wgmma (C.H^T: four m64n64k16 a 64-state step, C and H K-major
# from swizzled tiles; W x: W (or CB f) from registers, x the MN-major B; epilogue x reads swizzled).
# Predicted the scan 360 -> ~300 us (its LDSM / HMMA instructions, ~40% of its samples, mostly gone).
R=$(pwd); O=$OUT/s31d; mkdir -p $O
for w in c d; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s31d.tgz s31d && rm -rf s31d; }
trap fin EXIT
ab() { for w in c d; do
  echo "-- $w r$1"
  run $w 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_scan|chunk_state|dstate16" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== d ssd tests ($((SECONDS-T0)) s)" >> $S
run d 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_d.txt 2>&1; echo "rc $?" >> $O/tests_ssd_d.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_d.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
for t in memcheck racecheck; do echo "== $t d ($((SECONDS-T0)) s)" >> $S; run d 60 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
