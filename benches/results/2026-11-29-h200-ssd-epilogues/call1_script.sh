#!/bin/bash
# stop 30 call 1: main 260e10f: the wide channel-last forward's GPU tests (never run), racecheck /
# synccheck of the conv cases (the wide forward included: d 1032 bf16); ncu (full + source
# counters) of ssd2_chunk_scan at b8 L2048, for the stop's SSD work.
R=$(pwd); O=$OUT/s30a; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-m .dev/wheel-m/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t30
echo "tests ($((SECONDS-T0)) s)" >> $O/times.txt
run m 150 python3 -m pytest -q $T/tests/test_conv_gpu.py -m gpu -n 8 -p no:cacheprovider > $O/tests_conv_m.log 2>&1
echo "racecheck ($((SECONDS-T0)) s)" >> $O/times.txt
run m 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py conv > $O/racecheck_m.log 2>&1; echo "rc $?" >> $O/racecheck_m.log
echo "synccheck ($((SECONDS-T0)) s)" >> $O/times.txt
run m 120 compute-sanitizer --tool synccheck --error-exitcode 9 python3 $T/tools/sanitize_cases.py conv > $O/synccheck_m.log 2>&1; echo "rc $?" >> $O/synccheck_m.log
echo "ssd profile ($((SECONDS-T0)) s)" >> $O/times.txt
run m 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only > $O/ssd_prof_m.txt 2>&1
echo "ncu ($((SECONDS-T0)) s)" >> $O/times.txt
run m 120 ncu --profile-from-start off --set full --section SourceCounters -k regex:ssd2_chunk_scan -c 1 -o $O/ncu_scan python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $O/ncu_scan.log 2>&1
run m 30 ncu --import $O/ncu_scan.ncu-rep --print-summary none > $O/ncu_scan.txt 2>&1
run m 30 ncu --import $O/ncu_scan.ncu-rep --page source --print-source sass --csv > $O/ncu_scan_src.csv 2>&1
rm -f $O/ncu_scan.ncu-rep
echo "done ($((SECONDS-T0)) s)" >> $O/times.txt
cd $OUT && tar czf s30a.tgz s30a && rm -rf s30a
