#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
timeout 400 python3 benches/fp8_attention.py --schedules --dims 128 --rounds 2 > $OUT/logs/sched.txt 2>&1; echo "rc=$?"
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/logs/sched.txt"):
    if l.startswith("{"):
        r = json.loads(l)
        print(r["d"], r["causal"], r["s"], "fp8", r["fp8_tflops"], "pipe", r["fp8_pipe_tflops"], "plain", r["fp8_plain_tflops"], "bf16", r["bf16_tflops"], "cudnn", r["cudnn_tflops"])
PY
