#!/bin/bash
# stop 31 call 5: wheel d (c104a62's kernels) beside mamba_ssm's Triton SSD (e9594ce) in the same
# process: 2k forward and forward+backward, 8k forward; the real-time shape's forward.
R=$(pwd); O=$OUT/s31e; mkdir -p $O
for w in d; do pip install -q --no-deps --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT|head -1|tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS; T=.dev/t31; S=$O/summary.txt
fin() { echo "done ($((SECONDS-T0)) s)" >> $S; cd $OUT && tar czf s31e.tgz s31e && rm -rf s31e; }
trap fin EXIT
echo "== 2k beside Triton ($((SECONDS-T0)) s)" >> $S
run d 150 python3 $T/tools/ssd_profile.py --shape 2k --reps 4 --paths 2 --mamba-src .dev/peers/mamba > $O/prof_2k_d_triton.txt 2>&1
grep -E "^## " $O/prof_2k_d_triton.txt >> $S
echo "== 8k beside Triton ($((SECONDS-T0)) s)" >> $S
run d 150 python3 $T/tools/ssd_profile.py --shape 8k --reps 3 --paths 2 --fwd-only --mamba-src .dev/peers/mamba > $O/prof_8k_d_triton.txt 2>&1
grep -E "^## " $O/prof_8k_d_triton.txt >> $S
echo "== rt ($((SECONDS-T0)) s)" >> $S
run d 60 python3 $T/tools/ssd_profile.py --shape rt --reps 20 --paths 2 --fwd-only > $O/prof_rt_d.txt 2>&1
grep -E "^## " $O/prof_rt_d.txt >> $S
