#!/usr/bin/env bash
# One GPU call for the warp-specialised TMA forward (cuda/flash_fwd_sm90_tma.cu), with the wheel
# built here carried in .dev/wheel (bash tools/build_wheel.sh). Stages (default: all three):
#   check     each schedule (plain, FLASHSCAN_SM90_PIPE, FLASHSCAN_SM90_PINGPONG) against float64
#             with NaN-poisoned outputs, fp16 and bf16 (tools/sm90_fwd_check.py --check-only)
#   sanitize  compute-sanitizer memcheck (TMA boxes past seqlen, the mbarrier ring) and synccheck
#             (named barriers) over three small odd shapes, plain and ping-pong schedules
#   time      TFLOP/s: the defaults (head dim 64 on 192 rows, 128 ping-pong) beside SDPA
#             FlashAttention-2 and cuDNN, each 128-row schedule and the cp.async wgmma kernel
#             (FLASHSCAN_SM90_TMA=0) ours-only
# Every Python run is killed after its limit (a deadlocked ring shows as rc 137). Logs in $OUT.
#   bash tools/sm90_tma_gpu.sh check sanitize time
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(check sanitize time)
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site .dev/wheel/flashscan-*.whl || exit 1
repo="$PWD"
check="$repo/tools/sm90_fwd_check.py"
export PYTHONPATH=/tmp/site FLASHSCAN_SM90_WGMMA=1
cd /tmp || exit 1
echo "wheel commit: $(cat "$repo/.dev/wheel/COMMIT" 2>/dev/null | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

# run NAME LIMIT_S ENV... -- ARGS...: one python3 (or sanitizer) run, logged to $OUT/NAME.log
run() {
  local name=$1 limit=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "=== $name"
  # a cache of its own per run: what it built says which kernel really ran (a refused tensor
  # map falls back to the cp.async kernel silently)
  local cache="/tmp/flashscan-cache-$name"
  rm -rf "$cache"
  env "${envs[@]}" FLASHSCAN_CACHE_DIR="$cache" timeout -s KILL "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  local built
  built="$(ls "$cache" 2>/dev/null | sed 's/-sm_.*//' | sort | uniq -c | tr '\n' ' ')"
  echo "=== $name rc=$rc built: $built"
  echo "$name rc=$rc built: $built" >>"$OUT/summary.txt"
}

# 128 query rows a CTA at every head dim, each schedule; `defaults`: head dim 64 on 192 rows
# (three consumer warpgroups, plain), head dim 128 ping-pong
tma=(FLASHSCAN_SM90_TMA=1 FLASHSCAN_SM90_PINGPONG=0 FLASHSCAN_SM90_BLOCK_M=128)
pipe=(FLASHSCAN_SM90_TMA=1 FLASHSCAN_SM90_PIPE=1 FLASHSCAN_SM90_BLOCK_M=128)
pingpong=(FLASHSCAN_SM90_TMA=1 FLASHSCAN_SM90_PINGPONG=1 FLASHSCAN_SM90_BLOCK_M=128)
defaults=(FLASHSCAN_SM90_TMA=1)
for stage in "${stages[@]}"; do
  case "$stage" in
    check)
      # a quick odd-shape pass first: a hang or a wrong ring shows before the long list
      run quick-plain 60 "${tma[@]}" -- python3 "$check" --quick
      run check-plain 150 "${tma[@]}" -- python3 "$check" --check-only
      run check-pipe 150 "${pipe[@]}" -- python3 "$check" --check-only
      run check-pingpong 150 "${pingpong[@]}" -- python3 "$check" --check-only
      run check-defaults 150 "${defaults[@]}" -- python3 "$check" --check-only
      ;;
    sanitize)
      for tool in memcheck synccheck; do
        run "$tool-plain" 180 "${tma[@]}" -- compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$check" --quick
        run "$tool-pingpong" 180 "${pingpong[@]}" -- compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$check" --quick
        run "$tool-defaults" 180 "${defaults[@]}" -- compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$check" --quick
      done
      ;;
    time)
      run time-defaults-peers 240 "${defaults[@]}" -- python3 "$check" --time-only
      run time-pingpong 120 "${pingpong[@]}" -- python3 "$check" --time-only --ours-only
      run time-pipe 120 "${pipe[@]}" -- python3 "$check" --time-only --ours-only
      run time-plain 120 "${tma[@]}" -- python3 "$check" --time-only --ours-only
      run time-cpasync 120 FLASHSCAN_SM90_TMA=0 -- python3 "$check" --time-only --ours-only
      ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== summary"
cat "$OUT/summary.txt"
grep -h "CORRECTNESS\|FAIL" "$OUT"/check-*.log "$OUT"/quick-*.log 2>/dev/null | head -40
grep -h "ERROR SUMMARY" "$OUT"/memcheck-*.log "$OUT"/synccheck-*.log 2>/dev/null
