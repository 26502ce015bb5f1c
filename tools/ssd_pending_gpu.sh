#!/usr/bin/env bash
# The SSD's GPU checks and timings around the sm_90a backward state kernel `ssd_bwd_dstate_pass`
# (L_c + the reverse state passing in one kernel; the default since 2026-12-05,
# FLASHSCAN_SSD_BWD_STATE_PASS=0 runs the pair; `check` sets 1, `checkoff` 0).
# Runs: 2026-12-05 (benches/results/2026-12-05-h200-ssd-pending/: its tests, 141.3 against
# 120.8 + 93.4 us) and 2026-12-05-h200-ssd-bwd-state-pass/ (sanitize check synccheck checkoff
# timebwd ncu triton). On an H100 /
# H200 with the wheel built here carried in .dev/wheel (bash tools/build_wheel.sh) and, for
# `triton`, the mamba snapshot in .dev/peers/mamba. Stages (each Python run killed after its
# limit, so a hang shows as rc 137; the device tool allows 600 s a command, so split them over
# calls on one warm machine):
#   bash tools/ssd_pending_gpu.sh sanitize check   (< 560 s)
#   bash tools/ssd_pending_gpu.sh synccheck timebwd checkoff
#   bash tools/ssd_pending_gpu.sh triton           (< 600 s: the Triton backward's autotune)
#   quick     the kernel's own tests, fused and pair, against float64 under the rule and the
#             kernels launched against the switch: a wrong index shows in seconds
#   check     every SSD GPU test with the kernel (FLASHSCAN_SSD_BWD_STATE_PASS=1); checkoff: without
#   sanitize  memcheck / racecheck of tools/sanitize_cases.py ssd_bwd_pass; synccheck: synccheck
#   timebwd   tools/ssd_profile.py b8 L2048 80 x 64, state 128: the forward + backward with and
#             without the kernel, two alternations
#   ncu       one launch each of the forward's chunk outputs and chunk states and of the
#             backward's state kernel and dx (SpeedOfLight, scheduler, warp states, memory)
#   triton    benches/ssd.py beside mamba_ssm's Triton SSD (forward and forward + backward, each
#             row guarded)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
L="$OUT/logs"  # (tarred at the end: the device tool brings back at most 8 files)
mkdir -p "$L"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(quick check)
rm -rf /tmp/site  # (a warm machine keeps the last call's package)
python3 -m pip install -q --no-deps --no-index --target /tmp/site .dev/wheel/flashscan-*.whl \
  .dev/pydeps/*.whl || exit 1
repo="$PWD"
export PYTHONPATH=/tmp/site FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache-ssd
# kernels compiled ahead on the CPU with the device's NVRTC major.minor (13.0), if carried
# (~60 MB of CUBINs, 13 MB packed: the carry limit is 64 MiB):
#   FLASHSCAN_CACHE_DIR=.dev/fscache python -m flashscan precompile --arch sm_90a --all \
#     --family ssd --family ssd_fwd2 --family ssd_bwd     (with that NVRTC: FLASHSCAN_NVRTC=...)
#   tar czf .dev/fscache.tgz -C .dev fscache && rm -r .dev/fscache
if [ -f .dev/fscache.tgz ]; then
  mkdir -p "$FLASHSCAN_CACHE_DIR" && tar xzf .dev/fscache.tgz -C "$FLASHSCAN_CACHE_DIR" \
    --strip-components=1 --skip-old-files
fi
cd /tmp || exit 1
echo "wheel commit: $(cat "$repo/.dev/wheel/COMMIT" 2>/dev/null | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

# run NAME LIMIT_S CMD...: logged to $L/NAME.log, its last 8 lines and rc printed, rc kept in
# summary.txt
RUN_LOGS="$L" RUN_TAIL=8
source "$repo/tools/gpu_run.sh"
on=(env FLASHSCAN_SSD_BWD_STATE_PASS=1)
off=(env FLASHSCAN_SSD_BWD_STATE_PASS=0)
tests=("$repo/tests/test_ssd_gpu.py" "$repo/tests/test_ssd.py")
prof="$repo/tools/ssd_profile.py"
for stage in "${stages[@]}"; do
  case "$stage" in
    quick)
      run quick 200 python3 -m pytest "${tests[0]}" -q -p no:cacheprovider -n 4 \
        -k "backward_fused_state_passing"
      ;;
    check)
      run check 240 "${on[@]}" python3 -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider -n 8
      ;;
    checkoff)
      run check-off 240 "${off[@]}" python3 -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider -n 8
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        run "san-$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$repo/tools/sanitize_cases.py" ssd_bwd_pass
      done
      ;;
    synccheck)
      run san-synccheck 150 compute-sanitizer --tool synccheck --error-exitcode 9 \
        python3 "$repo/tools/sanitize_cases.py" ssd_bwd_pass
      ;;
    timebwd)
      for r in 1 2; do
        run "step-fused-$r" 90 "${on[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
        run "step-pair-$r" 90 "${off[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
      done
      grep -HE "^## |state|dstate" "$L"/step-*.log >"$OUT/time-summary.txt"
      ;;
    ncu)
      S=(--section SpeedOfLight --section SchedulerStats --section WarpStateStats
        --section Occupancy --section MemoryWorkloadAnalysis)
      for k in ssd2_chunk_scan_ws ssd2_chunk_state_pass; do
        run "ncu-$k" 150 ncu --profile-from-start off "${S[@]}" -k "regex:^$k\$" -c 1 \
          python3 "$prof" --shape 2k --paths 2 --ncu-range fwd
      done
      for k in ssd_bwd_dstate_pass ssd_bwd_chunk_dx16; do
        run "ncu-$k" 150 "${on[@]}" ncu --profile-from-start off "${S[@]}" -k "regex:^$k\$" -c 1 \
          python3 "$prof" --shape 2k --paths 2 --ncu-range step
      done
      grep -HE "Duration|Throughput|Busy|Eligible|Issued Warp|Registers|Achieved Occ|Warp Cycles" \
        "$L"/ncu-*.log >"$OUT/ncu-summary.txt"
      ;;
    triton)
      run triton 580 python3 "$repo/benches/ssd.py" --mamba-src "$repo/.dev/peers/mamba" \
        --fwd-paths 2 --bwd-paths 2 --out "$OUT"
      ;;
    *)
      echo "unknown stage $stage" >&2
      exit 2
      ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
