#!/usr/bin/env bash
# stop 36 call 2 (wheel ab = p + the mask decided per warp, per-row limits; FLASHSCAN_DEV_MASK_OLD=1
# compiles p's mask): attention / TMA GPU tests on the new mask, racecheck, the in-process A/B
# old / new (chains of 8), ncu of hd64 causal s512 on the new mask
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-ab .dev/wheel-ab/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-ab/COMMIT | tee $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-ab:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-ab "$@"; }
CHK=$repo/tools/sm90_fwd_check.py
run timeout -s KILL 200 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $CHK --quick > $L/san-racecheck.log 2>&1 &
run timeout -s KILL 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $CHK --quick > $L/san-memcheck.log 2>&1 &
run timeout 240 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py -m gpu -q -p no:cacheprovider -n 8 > $L/tests-ab.log 2>&1; echo "tests rc $?"; tail -2 $L/tests-ab.log
grep -h "FAIL\|Error" $L/tests-ab.log | head -5
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS' $f | tr '\n' ' ')"; done
SW=$repo/.dev/scripts/attn_sweep.py
C="old:FLASHSCAN_DEV_MASK_OLD=1;new:"
run timeout 150 python3 $SW --chain 8 --rounds 4 --shapes 64:512,64:1024,64:2048,64:8192,128:512,128:1024,128:2048,128:8192 --configs "$C" > $L/causal.jsonl 2>> $L/sweep.err; echo "causal rc $?"
run timeout 60 python3 $SW --causal 0 --chain 8 --rounds 4 --shapes 64:1000,64:2048,128:1000 --configs "$C" > $L/unmasked.jsonl 2>> $L/sweep.err; echo "unmasked rc $?"
python3 - $L/causal.jsonl $L/unmasked.jsonl <<'PY'
import json, sys, statistics
for f in sys.argv[1:]:
    print(f.rsplit("/", 1)[-1])
    for l in open(f):
        r = json.loads(l)
        keys = [k for k in r if k != "shape" and not k.endswith("_all")]
        b = keys[0]
        rr = {k: statistics.median(x / y for x, y in zip(r[k + "_all"], r[b + "_all"])) for k in keys}
        print(f"  {r['shape']:26s} " + "  ".join(f"{k} {r[k]:6.1f} ({rr[k]:.3f})" for k in keys))
PY
tail -3 $L/sweep.err
N=$repo/.dev/scripts/ncu_attn.py
run timeout 90 ncu --target-processes all -k "regex:flash" --launch-skip 3 --launch-count 1 --section SpeedOfLight --section InstructionStats --section SchedulerStats -o $L/ncu-new64c512 python3 $N --hd 64 --seqlen 512 --causal 1 > $L/ncu.log 2>&1; echo "ncu rc $?"
ncu --import $L/ncu-new64c512.ncu-rep --page details > $L/ncu-new64c512.txt 2>&1
grep -E "Duration|Executed Instructions  |Issue Slots Busy|SM Frequency" $L/ncu-new64c512.txt
cd $OUT && tar czf logs.tgz logs && rm -rf logs
