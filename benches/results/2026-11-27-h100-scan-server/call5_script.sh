#!/usr/bin/env bash
# Call 5: flashscan.torch without grad through the core; GPU suites (scan, backward, training, attention, server); the host A/B again.
R=$OUT
SITE=$(mktemp -d)
pip install -q --no-deps --target "$SITE" .dev/wheel/*.whl >/dev/null 2>&1
export FLASHSCAN_CACHE_DIR="$SITE/cache" PYTHONPATH="$SITE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/summary.txt
cat .dev/wheel/COMMIT >> $R/summary.txt
timeout 300 python3 -m pytest tests/test_scan_server_gpu.py tests/test_scan_gpu.py tests/test_backward_gpu.py tests/test_training_gpu.py tests/test_attention_gpu.py tests/test_torch_autograd.py tests/test_layers.py -m gpu -n 8 -q -p no:cacheprovider > $R/tests.log 2>&1; echo "GPU tests rc $?" >> $R/summary.txt
tail -3 $R/tests.log >> $R/summary.txt
timeout 200 python3 tools/serve_host_ab.py --bursts 16 --calls 100 --mamba-triton .peers/mamba > $R/serve_ab.md 2>&1; echo "ab rc $?" >> $R/summary.txt
cat $R/summary.txt; tail -24 $R/serve_ab.md
