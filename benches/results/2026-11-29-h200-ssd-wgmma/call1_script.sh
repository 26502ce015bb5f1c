#!/bin/bash
# stop 31 call 1: main f9b6687: tests/test_ssd_gpu.py in full (9f59281's store_dd got only 65 backward
# tests last stop), the SSD forward profile, ncu (full) of ssd2_chunk_state and ssd2_state_passing at
# b8 L2048 (what limits them: the lead is fusing the state passing into the chunk states).
R=$(pwd); O=$OUT/s31a; mkdir -p $O
pip install -q --no-deps --target ${TMPDIR}/site-m .dev/wheel-m/*.whl 2>/dev/null
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s31a.tgz s31a && rm -rf s31a; }
trap fin EXIT
echo "== ssd tests ($((SECONDS-T0)) s)" >> $S
run m 200 python3 -m pytest -q $T/tests/test_ssd_gpu.py $T/tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $O/tests_ssd_m.txt 2>&1; echo "rc $?" >> $O/tests_ssd_m.txt
grep -E "^FAILED|passed|failed|^rc" $O/tests_ssd_m.txt | head -20 >> $S
echo "== profile ($((SECONDS-T0)) s)" >> $S
run m 90 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --fwd-only > $O/prof_2k_m.txt 2>&1
cat $O/prof_2k_m.txt | head -40 >> $S
echo "== ncu ($((SECONDS-T0)) s)" >> $S
run m 150 ncu --profile-from-start off --set full -k regex:"ssd2_chunk_state|ssd2_state_passing" -c 2 -o $O/ncu_st python3 $T/tools/ssd_profile.py --shape 2k --paths 2 --ncu-range fwd > $O/ncu_st.log 2>&1
run m 30 ncu --import $O/ncu_st.ncu-rep --print-summary none > $O/ncu_st.txt 2>&1
rm -f $O/ncu_st.ncu-rep
