#!/bin/bash
# stop 21 call 2: ncu of the channel-first forwards (ours, causal-conv1d's); the conv1d bench's GPU-time
# column; the same-up-to-order tests over several seeds
pip install -q --no-deps --no-index --target ${TMPDIR}/site-head .dev/wheel-head/*.whl 2>/dev/null
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
P="--peer .peers/causal-conv1d .dev/peer-cc"
for k in causal_conv1d_fwd_cf causal_conv1d_fwd_kernel causal_conv1d_bwd_cf causal_conv1d_bwd_kernel; do
  run head 100 ncu --clock-control none --kernel-name regex:"^$k" --launch-skip 2 --launch-count 1 --set full python3 tools/conv1d_profile.py ncu $P > $OUT/ncu_$k.txt 2>&1
  echo "== $k ($((SECONDS-T0)) s)"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Issue Slots Busy|Executed Instructions  |Block Limit" $OUT/ncu_$k.txt | head -16
done
echo "== bench ($((SECONDS-T0)) s)"
run head 200 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench > $OUT/bench.log 2>&1; echo "rc $?"
tail -30 $OUT/bench.log
echo "== tests ($((SECONDS-T0)) s)"
for i in 1 2 3; do
  (cd /tmp && run head 120 python3 -m pytest $R/tests/test_torch_eager.py "$R/tests/test_backward_gpu.py::test_scan_backward_without_saved_states_matches" -m gpu -n 8 -q -p no:cacheprovider 2>&1 | tail -2)
done
echo "done ($((SECONDS-T0)) s)"
