#!/bin/bash
# stop 32 call 4: d = c (acc303a) + the scan diagonal block by warp: below each warp 16 x 16 diagonal the
# decay factored at its first row (2 FMUL an element, 4 MUFU a step), on it masked without seg reads, past
# it zero (predicted scan -3..6%). A/B c/d two alternations, SSD GPU tests + memcheck / racecheck on d,
# ncu (source counters) of the scan on d.
R=$(pwd); O=$OUT/s32d; mkdir -p $O
for w in c d; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s32d.tgz s32d && rm -rf s32d; }
trap fin EXIT
ab() { for w in $2; do
  echo "-- $w r$1"
  run $w 100 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|chunk_state|chunk_scan|dstate16|state_passing" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 "c d" >> $S 2>&1
echo "== d ssd tests ($((SECONDS-T0)) s)" >> $S
run d 170 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_d.txt 2>&1; echo "rc $?" >> $O/tests_ssd_d.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_d.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 "d c" >> $S 2>&1
for t in memcheck racecheck; do echo "== $t d ($((SECONDS-T0)) s)" >> $S; run d 70 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
echo "== ncu d ($((SECONDS-T0)) s)" >> $S
run d 120 ncu --profile-from-start off --set full --import-source yes --section SourceCounters -k regex:"^ssd2_chunk_scan$" -c 1 -o $O/ncu_scan python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $O/ncu_scan.log 2>&1
run d 30 ncu --import $O/ncu_scan.ncu-rep --print-summary none > $O/ncu_scan.txt 2>&1
run d 60 ncu --import $O/ncu_scan.ncu-rep --page source --print-source sass --csv > $O/ncu_scan_src.csv 2>&1
gzip $O/ncu_scan_src.csv; rm -f $O/ncu_scan.ncu-rep
grep -E "Duration|Issue Slots Busy|Executed Instructions  " $O/ncu_scan.txt >> $S
