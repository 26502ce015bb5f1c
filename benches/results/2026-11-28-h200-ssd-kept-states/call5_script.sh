#!/bin/bash
# stop 24, call 5: ncu of the 16-bit backward's dstate16 / dc16 / db16 (each slower than Triton's
# counterpart in call 4) at b8 L2048, for the next stop's work.
pip install -q --no-deps --no-index --target ${TMPDIR}/site-keep3 .dev/wheel-keep3/*.whl 2>/dev/null
export PYTHONPATH=${TMPDIR}/site-keep3 FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-keep3 PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 200 ncu --profile-from-start off --set full -k "regex:ssd_bwd_chunk_(dstate16|dc16|db16)" -c 3 --page details python3 tools/ssd_profile.py --shape 2k --ncu-range step > $OUT/ncu_bwd16.txt 2>&1
echo "rc $? ($((SECONDS-T0)) s)" | tee -a $OUT/ncu_bwd16.txt
grep -E "^  ssd_bwd|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Block Limit|Waves Per SM|L1/TEX Hit|Warp Cycles Per Issued" $OUT/ncu_bwd16.txt | head -60
