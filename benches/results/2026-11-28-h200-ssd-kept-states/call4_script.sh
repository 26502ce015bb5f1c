#!/bin/bash
# stop 24, call 4: keep3 (kept states, pass_states<kCompact> at 48 registers): the whole GPU suite,
# one A/B round beside main (c5438b4), memcheck, then the Triton SSD forward+backward beside ours.
for w in head keep3; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
L=${TMPDIR}/logs; mkdir -p $L
S=$OUT/summary.txt
echo "== keep3: whole GPU suite" | tee -a $S
(cd /tmp && run keep3 330 python3 -m pytest $R/tests -m gpu -n 8 -q -p no:cacheprovider > $L/gpu_suite.txt 2>&1; echo "rc $?" >> $L/gpu_suite.txt)
grep -E "^FAILED|passed|failed|^rc" $L/gpu_suite.txt | head -30 | tee -a $S
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $S
for m in head keep30 keep31; do
  w=${m%[01]}; k=${m#keep3}; [ "$m" = head ] && k=1
  echo "-- $m"
  run $w 60 env FLASHSCAN_SSD_KEEP_STATES=$k python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $L/prof_${m}.txt 2>&1
  grep -E "^## SSD|chunk_state|state_passing|chunk_prep|bwd_dt|dx16" $L/prof_${m}.txt
done | tee -a $S
echo "== memcheck keep3 ($((SECONDS-T0)) s)" | tee -a $S; run keep3 70 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $L/memcheck.txt 2>&1; echo "rc $?" >> $L/memcheck.txt; grep -v "^========= *$" $L/memcheck.txt | tail -3 | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
left=$((560 - (SECONDS-T0)))
echo "== Triton beside ($((SECONDS-T0)) s, $left s left)" | tee -a $S
[ $left -gt 60 ] && run keep3 $left python3 tools/ssd_profile.py --shape 2k --reps 2 --paths 2 --mamba-src .peers/mamba > $L/triton_fwd_bwd.txt 2>&1; echo "rc $?" >> $L/triton_fwd_bwd.txt
grep -E "^## " $L/triton_fwd_bwd.txt | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
echo "done ($((SECONDS-T0)) s)" | tee -a $S
