#!/usr/bin/env bash
# Call 14: the review mends (66a1fc5: Core::find_or_learn, _backend.make_server): the server, SSD and conv GPU tests and memcheck.
R=$OUT
SITE=$(mktemp -d)
pip install -q --no-deps --target "$SITE" .dev/wheel/*.whl >/dev/null 2>&1
export FLASHSCAN_CACHE_DIR="$SITE/cache" PYTHONPATH="$SITE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/summary.txt
cat .dev/wheel/COMMIT >> $R/summary.txt
timeout 200 python3 -m pytest tests/test_torch_exchange.py tests/test_servers_glue.py tests/test_scan_server_gpu.py tests/test_ssd_gpu.py tests/test_conv_gpu.py tests/test_torch_autograd.py -n 8 -q -p no:cacheprovider > $R/tests.log 2>&1; echo "tests rc $?" >> $R/summary.txt
tail -2 $R/tests.log >> $R/summary.txt
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest tests/test_scan_server_gpu.py -q -p no:cacheprovider > $R/memcheck_server.log 2>&1; echo "memcheck rc $?" >> $R/summary.txt
tail -3 $R/memcheck_server.log >> $R/summary.txt
cat $R/summary.txt
