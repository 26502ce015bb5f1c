#!/usr/bin/env bash
# Call 4: the scan forward kernel at the real-time shapes: base (7c8e3c9+) vs the padded-step skip, with packed / unpacked B-C staging.
R=$OUT
SA=$(mktemp -d); SB=$(mktemp -d); REF=$(mktemp -d)
pip install -q --no-deps --target $SA .dev/wheel-base/*.whl >/dev/null 2>&1
pip install -q --no-deps --target $SB .dev/wheel/*.whl >/dev/null 2>&1
export FLASHSCAN_CACHE_DIR=$REF/cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/summary.txt
cat .dev/wheel-base/COMMIT .dev/wheel/COMMIT >> $R/summary.txt
for rep in 1 2; do
for shape in rt32 rt16 rt8 rt1 2k; do
  echo "{\"variant\": \"A base\", \"rep\": $rep, \"row\": $(PYTHONPATH=$SA timeout 60 python3 tools/scan_tile_sweep.py --child $shape --ref $REF/$shape.npz --save --reps 50 | tail -1)}" >> $R/kernel_ab.jsonl
  echo "{\"variant\": \"B skip\", \"rep\": $rep, \"row\": $(PYTHONPATH=$SB timeout 60 python3 tools/scan_tile_sweep.py --child $shape --ref $REF/$shape.npz --reps 50 | tail -1)}" >> $R/kernel_ab.jsonl
  echo "{\"variant\": \"C skip+unpacked\", \"rep\": $rep, \"row\": $(FLASHSCAN_SCAN_PACK_BC=0 PYTHONPATH=$SB timeout 60 python3 tools/scan_tile_sweep.py --child $shape --ref $REF/$shape.npz --reps 50 | tail -1)}" >> $R/kernel_ab.jsonl
done
done
echo kernels done >> $R/summary.txt
export PYTHONPATH=$SB
timeout 150 python3 -m pytest tests/test_scan_gpu.py tests/test_backward_gpu.py tests/test_scan_server_gpu.py -m gpu -n 8 -q -p no:cacheprovider > $R/tests_scan.log 2>&1; echo "scan tests (packed) rc $?" >> $R/summary.txt
tail -2 $R/tests_scan.log >> $R/summary.txt
FLASHSCAN_SCAN_PACK_BC=0 timeout 150 python3 -m pytest tests/test_scan_gpu.py -m gpu -n 8 -q -p no:cacheprovider > $R/tests_scan_unpacked.log 2>&1; echo "scan tests (unpacked) rc $?" >> $R/summary.txt
tail -2 $R/tests_scan_unpacked.log >> $R/summary.txt
cat $R/summary.txt
python3 -c "
import json
rows=[json.loads(l) for l in open('$R/kernel_ab.jsonl')]
for r in rows: print(r['variant'], r['rep'], r['row'].get('shape'), r['row'].get('kernel_us'), r['row'].get('graph_us'), r['row'].get('status'), r['row'].get('max_rel_diff'))
"
