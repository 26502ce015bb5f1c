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
run small 120 python3 tools/fp8_small.py
run tests 200 python3 -m pytest tests/test_fp8_gpu.py tests/test_fp8.py -q -p no:cacheprovider -n 4
run bench 200 python3 benches/fp8_attention.py --prepass --dims 128 --rounds 2
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/logs/bench.log"):
    if l.startswith("{"):
        r = json.loads(l)
        print(r["d"], r["causal"], r["s"], "fp8", r["fp8_tflops"], "prepass", r["fp8_prepass_tflops"], "kernel", r["fp8_kernel_tflops"], "bf16", r["bf16_tflops"], "cudnn", r["cudnn_tflops"], "k", r.get("fp8_kernel_us"), "pk", r.get("prepass_kernel_us"), "vt", r.get("vt_us"), r["guard"])
PY
