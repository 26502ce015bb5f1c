#!/bin/bash
# next stop, call 1 (prepared at the end of stop 23). prep/next24 was rebased onto 67bb559 (a760fa3; the review's
# helpers, same kernels): the wheels below were built before that, from the pre-rebase commits named; rebuild to match.
# Wheels (rebuilt stop 24): head = 67bb559 (main), nexta = fb40ef3, next = a760fa3 (prep/next24).
# .dev/wheel-nexta = 9f4764b (prep/next24 without its last commit: 682c76f test_backward_twelve_heads; f3c81f3 prep
# stores no seg without seq_idx; 9f4764b straddle_da loads first), .dev/wheel-next = 8f8efda (+ ssd_bwd_dt on 8-head
# CTAs). Predictions (H200, b8 L2048 80x64 state 128 chunk 256 bf16): ssd2_chunk_prep 10 -> ~7.5 us (forward
# 692 -> ~689); ssd_bwd_dt 66 -> ~50 (nexta) -> ~40 (next).
for w in head nexta next; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
cp .dev/tests-next/test_ssd_gpu.py tests/   # prep/next24's tests (the twelve-heads backward case)
echo "== next: ssd tests" | tee $OUT/n4.txt
run next 200 python3 -m pytest -q tests/test_ssd_gpu.py tests/test_ssd.py -m gpu -n 8 -p no:cacheprovider > $OUT/tests_next_ssd.txt 2>&1; echo "rc $?" >> $OUT/tests_next_ssd.txt
grep -E "FAILED|passed|failed|^rc" $OUT/tests_next_ssd.txt | head | tee -a $OUT/n4.txt
echo "== A/B ($((SECONDS-T0)) s)" | tee -a $OUT/n4.txt
for w in head nexta next head nexta next; do echo "-- $w"; run $w 60 python3 tools/ssd_profile.py --shape 2k --reps 4 --paths 2 2>&1 | grep -E "^## SSD|prep|prologue|_dt\`"; done | tee -a $OUT/n4.txt
for t in memcheck racecheck; do echo "== $t next ($((SECONDS-T0)) s)" | tee -a $OUT/n4.txt; run next 90 compute-sanitizer --tool $t --error-exitcode 9 python3 tools/sanitize_cases.py ssd ssd_fwd2 > $OUT/$t.txt 2>&1; echo "rc $?" >> $OUT/$t.txt; grep -v "^========= *$" $OUT/$t.txt | tail -3 | tee -a $OUT/n4.txt; done
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/n4.txt
# call 2: the whole GPU suite on whatever lands (limit 400 s: ~280 s and its summary), with Triton beside
# the forward (tools/ssd_profile.py --shape 2k --fwd-only --mamba-src .peers/mamba).
