#!/usr/bin/env bash
# One GPU call for the opt-in wgmma backward (cuda/flash_bwd_sm90.cu, FLASHSCAN_SM90_BWD=1) on an
# H100 / H200, with the wheel built here carried in .dev/wheel (bash tools/build_wheel.sh).
# Stages (each Python run killed after its limit, so a hang shows as rc 137; the device tool
# allows 600 s per command, so run them as separate calls on one warm machine, e.g.
#   bash tools/sm90_bwd_gpu.sh sass            (< 300 s; first: this machine's ptxas)
#   bash tools/sm90_bwd_gpu.sh quick check     (< 600 s)
#   bash tools/sm90_bwd_gpu.sh time            (< 600 s)
#   bash tools/sm90_bwd_gpu.sh sanitize        (< 480 s)
#   bash tools/sm90_bwd_gpu.sh fallback        (< 600 s; the lead's gpu_check tests cover it too)
#   sass      tests/test_sm90_bwd_compile.py with this machine's NVRTC (its ptxas may schedule
#             differently from the one the CPU checks ran with): no spills, the HGMMA mix and
#             loop schedule, no instruction touching an in-flight wgmma's registers (< 300 s)
#   quick     the child-process test (its own cache: the wgmma backward must be what was built)
#             and tools/sm90_bwd_small.py's four odd shapes: a wrong descriptor shows in seconds
#   check     tests/test_backward_gpu.py -k sm90: the dense hd64 / hd128 matrix, poisoned
#             buffers and graph capture with the switch on
#   fallback  the rest of the attention backward matrix (switch off: the old kernel unchanged)
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck over the small shapes (switch on)
#   time      benches/backward.py --suite attention --sm90-bwd --quick (seqlen 2k and 8k, hd 64 /
#             128, causal or not): flashscan with the switch off and on beside SDPA
#             FlashAttention-2 and cuDNN, every row guarded against float64; time-full (not in
#             the default list): every seqlen 2k..16k, in a call of its own
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(quick check)
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site .dev/wheel/flashscan-*.whl || exit 1
repo="$PWD"
export PYTHONPATH=/tmp/site FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache-sm90bwd
cd /tmp || exit 1
echo "wheel commit: $(cat "$repo/.dev/wheel/COMMIT" 2>/dev/null | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

# run NAME LIMIT_S CMD...: logged to $OUT/NAME.log, tail and rc printed, rc kept in summary.txt
source "$repo/tools/gpu_run.sh"

small="$repo/tools/sm90_bwd_small.py"
for stage in "${stages[@]}"; do
  case "$stage" in
    quick)
      run quick-built 200 python3 -m pytest "$repo/tests/test_backward_gpu.py" -q -p no:cacheprovider \
        -k "sm90_kernel_is_what_runs"
      run quick-small 90 env FLASHSCAN_SM90_BWD=1 python3 "$small"
      ;;
    sass)
      run sass 290 python3 -m pytest "$repo/tests/test_sm90_bwd_compile.py" -q -p no:cacheprovider
      ;;
    check)
      run check-sm90 280 python3 -m pytest "$repo/tests/test_backward_gpu.py" -q -p no:cacheprovider \
        -k "sm90" --maxfail=10
      ;;
    fallback)
      run check-fallback 580 python3 -m pytest "$repo/tests/test_backward_gpu.py" -q -p no:cacheprovider \
        -k "attention and not sm90" --maxfail=10
      ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        run "sanitize-$tool" 150 env FLASHSCAN_SM90_BWD=1 compute-sanitizer --tool "$tool" \
          --error-exitcode 9 python3 "$small"
      done
      ;;
    time)
      run time 590 python3 "$repo/benches/backward.py" --suite attention --sm90-bwd --quick --out "$OUT/bench"
      ;;
    time-full)
      run time-full 590 python3 "$repo/benches/backward.py" --suite attention --sm90-bwd --out "$OUT/bench-full"
      ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== summary"
cat "$OUT/summary.txt"
grep -h "passed\|failed" "$OUT"/sass.log "$OUT"/quick-*.log "$OUT"/check-*.log 2>/dev/null | tail -5
grep -h "ERROR SUMMARY" "$OUT"/sanitize-*.log 2>/dev/null
grep -h "^| " "$OUT"/time*.log 2>/dev/null | head -40
