#!/usr/bin/env bash
# Call 10: the head (every server): GPU suites of the touched ops and the host A/B of all servers on one host.
R=$OUT
SITE=$(mktemp -d)
pip install -q --no-deps --target "$SITE" .dev/wheel/*.whl >/dev/null 2>&1
export FLASHSCAN_CACHE_DIR="$SITE/cache" PYTHONPATH="$SITE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/summary.txt
cat .dev/wheel/COMMIT >> $R/summary.txt
timeout 330 python3 -m pytest tests/test_torch_exchange.py tests/test_servers_glue.py tests/test_scan_server_gpu.py tests/test_scan_gpu.py tests/test_backward_gpu.py tests/test_training_gpu.py tests/test_ssd_gpu.py tests/test_conv_gpu.py tests/test_torch_autograd.py -n 8 -q -p no:cacheprovider > $R/tests.log 2>&1; echo "tests rc $?" >> $R/summary.txt
tail -3 $R/tests.log >> $R/summary.txt
timeout 200 python3 tools/serve_host_ab.py --bursts 16 --calls 100 --mamba-triton .peers/mamba > $R/serve_ab.md 2>&1; echo "ab rc $?" >> $R/summary.txt
cat $R/summary.txt; grep -n "^FAILED" $R/tests.log | head; tail -32 $R/serve_ab.md
