#!/bin/bash
# stop 23 call 3: the ddt_bias failure of call 2 (head vs land, bitwise, 25 seeds); Triton SSD and causal-conv1d beside ring
for w in head land ring; do pip install -q --no-deps --no-index --target ${TMPDIR}/site-$w .dev/wheel-$w/*.whl 2>/dev/null; done
R=$PWD
run() { local w=$1 t=$2; shift 2; timeout $t env PYTHONPATH=${TMPDIR}/site-$w FLASHSCAN_CACHE_DIR=${TMPDIR}/fs-cache-$w FLASHSCAN_COMMIT="$(cat $R/.dev/wheel-$w/COMMIT | tr -d '\n')" XLA_PYTHON_CLIENT_PREALLOCATE=false "$@"; }
export PYTHONUNBUFFERED=1
T0=$SECONDS
cp .dev/tests-next/test_ssd_gpu.py tests/
echo "== ddt seeds" | tee $OUT/c3.txt
for w in head land; do run $w 120 python3 .dev/scripts/ddt_seeds.py $w ${TMPDIR}/g-$w.pt 2>&1 | grep -v -i warn; done | tee -a $OUT/c3.txt
python3 - <<'PY' 2>&1 | tee -a $OUT/c3.txt
import torch
a, b = torch.load("${TMPDIR}/g-head.pt"), torch.load("${TMPDIR}/g-land.pt")
diff = [(s, k) for s in a for k in a[s] if not torch.equal(a[s][k], b[s][k])]
print("bitwise head == land over", len(a), "seeds:", not diff, diff[:10])
PY
echo "== SSD with Triton ($((SECONDS-T0)) s)" | tee -a $OUT/c3.txt
run ring 150 python3 tools/ssd_profile.py --shape 2k --reps 4 --fwd-only --mamba-src .peers/mamba > $OUT/ssd_2k_peer.txt 2>&1; grep -E "^## " $OUT/ssd_2k_peer.txt | tee -a $OUT/c3.txt
run ring 100 python3 tools/ssd_profile.py --shape rt --reps 4 --fwd-only --mamba-src .peers/mamba > $OUT/ssd_rt_peer.txt 2>&1; grep -E "^## " $OUT/ssd_rt_peer.txt | tee -a $OUT/c3.txt
echo "== conv bench ($((SECONDS-T0)) s)" | tee -a $OUT/c3.txt
run ring 200 python3 benches/conv1d.py --quick --conv1d-src .peers/causal-conv1d --conv1d-build .dev/peer-cc --out $OUT/bench > $OUT/bench.log 2>&1; tail -3 $OUT/bench.log | tee -a $OUT/c3.txt
echo "done ($((SECONDS-T0)) s)" | tee -a $OUT/c3.txt
