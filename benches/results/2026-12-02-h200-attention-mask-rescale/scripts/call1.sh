#!/usr/bin/env bash
# stop 36 call 1 (wheel p = e1167dd + one launch path + stream-ordered counter pair): TMA /
# attention / backward GPU tests, sanitizers (stream pair, scratch), the quick attention bench
# (cuDNN / FA2 in the same process) after the skip, ncu of the forward's misses and cuDNN's s512
TMPDIR=${TMPDIR:-/tmp}
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-p .dev/wheel-p/flashscan-*.whl || exit 1
python3 -m pip install -q --no-deps --no-index --upgrade --target ${TMPDIR}/site-deps .dev/pydeps/*.whl || exit 1
repo=$PWD
L=$OUT/logs; mkdir -p $L
cat .dev/wheel-p/COMMIT | tee $L/info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $L/info.txt
cd ${TMPDIR}
run() { PYTHONPATH=${TMPDIR}/site-p:${TMPDIR}/site-deps FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-p "$@"; }
CHK=$repo/tools/sm90_fwd_check.py
i=0
for cfg in "memcheck:" "racecheck:" "racecheck:FLASHSCAN_SM90_QUEUE_SCRATCH=1"; do
  tool=${cfg%%:*}; extra=${cfg#*:}; i=$((i+1))
  run timeout -s KILL 200 env FLASHSCAN_SM90_PERSIST_CTAS=2 FLASHSCAN_SM90_QUEUE_SECTION=3 $extra compute-sanitizer --tool $tool --error-exitcode 9 python3 $CHK --quick > $L/san-$i-$tool.log 2>&1 &
done
run timeout 240 python3 -m pytest $repo/tests/test_sm90_tma_gpu.py $repo/tests/test_attention_gpu.py $repo/tests/test_backward_gpu.py -k "not scan" -m gpu -q -p no:cacheprovider -n 8 > $L/tests-p.log 2>&1; echo "tests rc $?"; tail -3 $L/tests-p.log
grep -h "FAIL\|Error" $L/tests-p.log | head -5
wait
for f in $L/san-*.log; do echo "$(basename $f): $(grep -h 'SUMMARY\|CORRECTNESS' $f | tr '\n' ' ')"; done
run timeout 200 python3 -m flashscan bench --quick --suite attention --no-plots --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?"
grep -E "^\| (64|128) " $L/bench/results.md | head -14
N=$repo/.dev/scripts/ncu_attn.py
for spec in "f64c512:--hd 64 --seqlen 512 --causal 1" "f64s2048:--hd 64 --seqlen 2048 --causal 0" "f128s2048:--hd 128 --seqlen 2048 --causal 0" "f128c2048:--hd 128 --seqlen 2048 --causal 1" "cudnn64c512:--hd 64 --seqlen 512 --causal 1 --peer cudnn"; do
  name=${spec%%:*}; args=${spec#*:}
  run timeout 90 ncu --target-processes all -k "regex:flash|sdpa|fprop|fmha|attn" --launch-skip 3 --launch-count 1 --set full -o $L/ncu-$name python3 $N $args > $L/ncu-$name.log 2>&1; echo "ncu $name rc $?"
  ncu --import $L/ncu-$name.ncu-rep --page details > $L/ncu-$name.txt 2>&1
  grep -E "^  [a-z_0-9]+|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Eligible Warps" $L/ncu-$name.txt | head -12
done
run timeout 150 python3 $repo/benches/backward.py --quick --suite attention --out $L/backward > $L/backward.log 2>&1; echo "backward rc $?"
grep -E "^\| (64|128) " $L/backward/results.md | head -10
cd $OUT && tar czf logs.tgz logs && rm -rf logs
