#!/usr/bin/env bash
# Call 9: the SSD signature key without hash() (torch 2.11 compile); the suites of call 8 again.
R=$OUT
SITE=$(mktemp -d)
pip install -q --no-deps --target "$SITE" .dev/wheel/*.whl >/dev/null 2>&1
export FLASHSCAN_CACHE_DIR="$SITE/cache" PYTHONPATH="$SITE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/summary.txt
cat .dev/wheel/COMMIT >> $R/summary.txt
timeout 330 python3 -m pytest tests/test_torch_exchange.py tests/test_scan_server_gpu.py tests/test_ssd_gpu.py tests/test_ssd.py tests/test_torch_autograd.py tests/test_layers.py tests/test_torch_plans.py -n 8 -q -p no:cacheprovider > $R/tests.log 2>&1; echo "tests rc $?" >> $R/summary.txt
tail -3 $R/tests.log >> $R/summary.txt
cat $R/summary.txt; grep -n "^FAILED\|^E " $R/tests.log | head -20
