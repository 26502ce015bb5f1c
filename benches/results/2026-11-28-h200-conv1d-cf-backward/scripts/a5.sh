#!/bin/bash
# call 5: ncu of the committed channel-first backward and causal-conv1d's, side by side
pip install -q --no-deps --no-index --target ${TMPDIR}/site-final .dev/wheel-final/*.whl 2>/dev/null
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats --section ComputeWorkloadAnalysis"
export PYTHONPATH=${TMPDIR}/site-final FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-final
timeout 200 ncu --clock-control none --kernel-name causal_conv1d_bwd_cf --launch-skip 3 --launch-count 1 $S python3 tools/conv1d_profile.py ncu > $OUT/ncu_ours.txt 2>&1
timeout 250 ncu --clock-control none --kernel-name regex:causal_conv1d_bwd_kernel --launch-skip 3 --launch-count 1 $S python3 tools/conv1d_profile.py ncu --peer .peers/causal-conv1d .dev/peer-cc > $OUT/ncu_peer.txt 2>&1
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|Executed Instructions  |Eligible Warps|Block Limit|Issue Slots Busy|Mem Busy|Warp Cycles Per Issued" $OUT/ncu_ours.txt $OUT/ncu_peer.txt
