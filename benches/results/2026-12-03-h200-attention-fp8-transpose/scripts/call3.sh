#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 3 "$OUT/logs/$name.log"; }
FLASHSCAN_SM90_FP8_TRANSPOSE_SEL=1 run small-sel 120 python3 tools/fp8_small.py
FLASHSCAN_SM90_FP8_TRANSPOSE_DEPTH=2 run small-d2 120 python3 tools/fp8_small.py
FLASHSCAN_SM90_FP8_TRANSPOSE_SEL=1 run tests-sel 120 python3 -m pytest tests/test_fp8_gpu.py -q -p no:cacheprovider -n 4 -k "bit_for_bit or default"
for mode in default prepass sel d2; do
  env_=""; [ $mode = prepass ] && env_="FLASHSCAN_SM90_FP8_VT=prepass"; [ $mode = sel ] && env_="FLASHSCAN_SM90_FP8_TRANSPOSE_SEL=1"; [ $mode = d2 ] && env_="FLASHSCAN_SM90_FP8_TRANSPOSE_DEPTH=2"
  run ncu-$mode 150 env $env_ ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats -k regex:flash_fwd_sm90_tma -s 2 -c 1 python3 .dev/fp8_ncu_one.py
done
run bench 300 python3 benches/fp8_attention.py --prepass --transpose-sel --transpose-depth --dims 128 --rounds 2
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/logs/bench.log"):
    if l.startswith("{"):
        r = json.loads(l)
        print(r["d"], r["causal"], r["s"], "fp8", r["fp8_tflops"], "prepass", r["fp8_prepass_tflops"], "sel", r["fp8_sel_tflops"], "kernel", r["fp8_kernel_tflops"], "d2", r["fp8_d2_tflops"], "bf16", r["bf16_tflops"], "cudnn", r["cudnn_tflops"], "k", r.get("fp8_kernel_us"), "pk", r.get("prepass_kernel_us"), "vt", r.get("vt_us"), r["guard"])
PY
for mode in default prepass sel d2; do echo "## $mode"; grep -E "Duration|Shared Memory|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|Bank" "$OUT/logs/ncu-$mode.log" | head -20; done
