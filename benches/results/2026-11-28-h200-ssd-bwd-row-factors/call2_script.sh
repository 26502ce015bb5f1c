#!/bin/bash
# stop 25, call 2: prep/land25 (.dev/wheel-l25, 85aafb6: prep/compile-kept + L_c's two entries, one rounding the default)
# beside prep/compile-kept (.dev/wheel-n25, run-time flag). Whole GPU suite on l25 (its tests in .dev/l25),
# A/B at 2k (predicted: l25 default dstate16 <= 159 us; l25 HILO=1 back to ~171), Triton in the same process, racecheck.
for w in n25 l25; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=${TMPDIR}/logs; mkdir -p $L
S=$OUT/summary.txt
echo "== l25: whole GPU suite" | tee -a $S
(cd /tmp && run l25 330 python3 -m pytest $R/.dev/l25/tests -m gpu -n 8 -q -p no:cacheprovider > $L/suite.txt 2>&1; echo "rc $?" >> $L/suite.txt)
grep -E "^FAILED|^ERROR|passed|failed|^rc" $L/suite.txt | head -30 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
{
echo "-- n25"; run n25 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_n25.txt 2>&1; grep -E "^## SSD forward\+|dstate16" $L/prof_n25.txt
echo "-- l25 default"; run l25 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_l25.txt 2>&1; grep -E "^## SSD forward|dstate16" $L/prof_l25.txt
echo "-- l25 HILO=1"; run l25 60 env FLASHSCAN_SSD_DSTATE_HILO=1 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_l25_hilo.txt 2>&1; grep -E "^## SSD forward\+|dstate16" $L/prof_l25_hilo.txt
echo "-- l25 rt"; run l25 60 python3 tools/ssd_profile.py --shape rt --reps 8 --paths 2 > $L/prof_l25_rt.txt 2>&1; grep -E "^## SSD forward" $L/prof_l25_rt.txt
} 2>&1 | tee -a $S
echo "== racecheck l25 ($((SECONDS-T0)) s)" | tee -a $S; run l25 100 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $L/racecheck.txt 2>&1; echo "rc $?" >> $L/racecheck.txt; grep -v "^========= *$" $L/racecheck.txt | tail -3 | tee -a $S
left=$((560-(SECONDS-T0)))
if [ $left -gt 60 ]; then echo "== Triton beside l25 (${left} s left)" | tee -a $S; run l25 $left python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --mamba-src .peers/mamba > $L/prof_l25_triton.txt 2>&1; grep -E "^## " $L/prof_l25_triton.txt | tee -a $S; fi
echo "done ($((SECONDS-T0)) s)" | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
