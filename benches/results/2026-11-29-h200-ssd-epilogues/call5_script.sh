#!/bin/bash
# stop 30 call 5: e3 = 3f23013's kernels (main after this stop's first change), f1 = e3 + the
# backward's prologue records loaded before their first use (ssd_bwd_chunk_dx16, load_prologue).
# Predicted dx16 523 -> ~505 us (its prologue loop held ~8% of its stall samples in call 4).
R=$(pwd); O=$OUT/s30e; mkdir -p $O
for w in e3 f1; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t30; S=$O/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $S
ab() { for w in e3 f1; do
  echo "-- $w r$1"
  run $w 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 > $O/prof_2k_${w}_$1.txt 2>&1
  grep -E "^## SSD|dx16" $O/prof_2k_${w}_$1.txt
done; }
echo "== A/B r1 ($((SECONDS-T0)) s)" >> $S; ab 1 >> $S 2>&1
echo "== f1 ssd tests ($((SECONDS-T0)) s)" >> $S
run f1 200 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_f1.txt 2>&1; echo "rc $?" >> $O/tests_ssd_f1.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_f1.txt | head -20 >> $S
echo "== A/B r2 ($((SECONDS-T0)) s)" >> $S; ab 2 >> $S 2>&1
for t in memcheck racecheck; do echo "== $t f1 ($((SECONDS-T0)) s)" >> $S; run f1 90 compute-sanitizer --tool $t --error-exitcode 9 python3 $T/tools/sanitize_cases.py ssd ssd_fwd2 > $O/$t.txt 2>&1; echo "rc $?" >> $O/$t.txt; grep -v "^========= *$" $O/$t.txt | tail -3 >> $S; done
echo "done ($((SECONDS-T0)) s)" >> $S
cd $OUT && tar czf s30e.tgz s30e && rm -rf s30e
