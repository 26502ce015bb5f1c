#!/usr/bin/env bash
# One GPU call for the opt-in wgmma backward (cuda/flash_bwd_sm90.cu, FLASHSCAN_SM90_BWD=1) on an
# H100 / H200, with the wheel built here carried in .dev/wheel (bash tools/build_wheel.sh).
# Stages (default: all four, in this order; each Python run killed after its limit, so a hang
# shows as rc 137):
#   quick     the child-process test (its own cache: the wgmma backward must be what was built)
#             and two odd shapes: a wrong descriptor shows here in seconds
#   check     tests/test_backward_gpu.py: the sm90 matrix (switch on) and the whole attention
#             backward matrix (switch off, so the fallbacks stay right)
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck over small odd shapes (switch on)
#   time      benches/backward.py --suite attention --sm90-bwd: flashscan with the switch off
#             and on beside SDPA FlashAttention-2 and cuDNN, every row guarded against float64
#   bash tools/sm90_bwd_gpu.sh quick check sanitize time
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(quick check sanitize time)
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site .dev/wheel/flashscan-*.whl || exit 1
repo="$PWD"
export PYTHONPATH=/tmp/site FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache-sm90bwd
cd /tmp || exit 1
echo "wheel commit: $(cat "$repo/.dev/wheel/COMMIT" 2>/dev/null | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

# run NAME LIMIT_S CMD...: logged to $OUT/NAME.log, tail and rc printed, rc kept in summary.txt
run() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name"
  timeout -s KILL "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 30 "$OUT/$name.log"
  echo "=== $name rc=$rc"
  echo "$name rc=$rc" >>"$OUT/summary.txt"
}

small="$repo/tools/sm90_bwd_small.py"
for stage in "${stages[@]}"; do
  case "$stage" in
    quick)
      run quick-built 300 python3 -m pytest "$repo/tests/test_backward_gpu.py" -q -p no:cacheprovider \
        -k "sm90_kernel_is_what_runs"
      run quick-small 120 env FLASHSCAN_SM90_BWD=1 python3 "$small"
      ;;
    check)
      run check-sm90 400 python3 -m pytest "$repo/tests/test_backward_gpu.py" -q -p no:cacheprovider \
        -k "sm90" --maxfail=10
      run check-fallback 500 python3 -m pytest "$repo/tests/test_backward_gpu.py" -q -p no:cacheprovider \
        -k "attention and not sm90" --maxfail=10
      ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        run "sanitize-$tool" 300 env FLASHSCAN_SM90_BWD=1 compute-sanitizer --tool "$tool" \
          --error-exitcode 9 python3 "$small"
      done
      ;;
    time)
      run time 590 python3 "$repo/benches/backward.py" --suite attention --sm90-bwd --out "$OUT/bench"
      ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== summary"
cat "$OUT/summary.txt"
grep -h "passed\|failed" "$OUT"/quick-*.log "$OUT"/check-*.log 2>/dev/null | tail -5
grep -h "ERROR SUMMARY" "$OUT"/sanitize-*.log 2>/dev/null
grep -h "^| " "$OUT/time.log" 2>/dev/null | head -24
