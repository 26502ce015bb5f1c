#!/usr/bin/env bash
# the landed scan beside mamba_ssm built from source in the same run: forward bench, training-path bench
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
T=${TMPDIR:-/tmp}
python3 -m pip install -q --no-deps --no-index --target $T/site .dev/wheel/flashscan-*.whl .dev/pydeps/*.whl || exit 1
export PYTHONPATH=$T/site FLASHSCAN_CACHE_DIR=$T/fscache FLASHSCAN_COMMIT="$(head -1 .dev/wheel/COMMIT)" MAX_JOBS=16
echo "wheel: $(cat .dev/wheel/COMMIT | tr '\n' ' ')"
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 2 "$OUT/logs/$name.log"; }
cp -r .dev/peers/mamba $T/mamba
run bench 320 python3 -m flashscan bench --quick --suite scan --no-plots --mamba-src $T/mamba --out $OUT/bench
grep -E "^\| b" $OUT/bench/*.md | head -24
run training 200 python3 benches/backward.py --quick --suite scan --mamba-src $T/mamba --out $OUT/training
grep -E "^\|" $OUT/training/*.md | head -30
