#!/usr/bin/env bash
# The SSD's pending sm_90a GPU work, staged for the device tool (600 s a command: split the
# stages over calls on one warm machine and issue the next call at once).
# Pending: `ssd2_chunk_scan_ws_pipe` (the warp-specialised chunk outputs software-pipelined;
# opt-in, FLASHSCAN_SSD_SCAN_WS_PIPE=1; written 2026-12-05 with no device lent, predicted 200-220
# against 248 us at b8 L2048): its tests, racecheck / memcheck / synccheck, the A/B, then the
# default if faster (`entry()` in src/ops/ssd_scan_ws.rs).
#   bash tools/ssd_pending_gpu.sh pipe timepipe       (< 400 s)
#   bash tools/ssd_pending_gpu.sh triton              (< 580 s: --shapes 2k,real)
# Runs: 2026-12-05 (benches/results/2026-12-05-h200-ssd-pending/, -ssd-bwd-state-pass/: the
# backward's `ssd_bwd_dstate_pass`, the default since; FLASHSCAN_SSD_BWD_STATE_PASS=0 the pair).
# On an H100 / H200 with the wheel built here carried in .dev/wheel (bash tools/build_wheel.sh),
# the kernel cache seeded from .dev/fscache.tgz if carried and, for `triton`, the mamba snapshot
# in .dev/peers/mamba. Each Python run is killed after its limit (a hang shows as rc 137).
#   pipe      the warp-specialised tests in both forms (test_forward_warp_specialised), every SSD
#             GPU test with FLASHSCAN_SSD_SCAN_WS_PIPE=1, memcheck / racecheck / synccheck of
#             tools/sanitize_cases.py ssd_fwd2 (both forms)
#   timepipe  tools/ssd_profile.py b8 L2048 80 x 64, state 128, forward + step, with and without
#             the pipelined form, two alternations
#   quick     ssd_bwd_dstate_pass's own tests, fused and pair
#   check     every SSD GPU test with FLASHSCAN_SSD_BWD_STATE_PASS=1; checkoff: with =0
#   sanitize  memcheck / racecheck of tools/sanitize_cases.py ssd_bwd_pass; synccheck: synccheck
#   timebwd   tools/ssd_profile.py, the forward + backward with and without ssd_bwd_dstate_pass
#   ncu       one launch each of the forward's chunk outputs (both forms) and chunk states and of
#             the backward's state kernel and dx (SpeedOfLight, scheduler, warp states, memory,
#             source counters: the stall reasons by instruction)
#   triton    benches/ssd.py beside mamba_ssm's Triton SSD at 2k and the real-time shape (forward
#             and forward + backward, each row guarded; the default forms)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
L="$OUT/logs"  # (tarred at the end: the device tool brings back at most 8 files)
mkdir -p "$L"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(pipe timepipe)
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
# ab ON OFF VAR: tools/ssd_profile.py (2k: the forward and the step) with VAR=1 (logs ON-1, ON-2)
# and VAR=0 (OFF-1, OFF-2), alternated twice
ab() {
  for r in 1 2; do
    run "$1-$r" 90 env "$3=1" python3 "$prof" --shape 2k --reps 3 --paths 2
    run "$2-$r" 90 env "$3=0" python3 "$prof" --shape 2k --reps 3 --paths 2
  done
}
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
    pipe)
      pon=(env FLASHSCAN_SSD_SCAN_WS_PIPE=1)
      run pipe-ws 120 python3 -m pytest "${tests[0]}" -q -p no:cacheprovider -n 4 \
        -k "forward_warp_specialised"
      run pipe-check 200 "${pon[@]}" python3 -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider -n 8
      for tool in memcheck racecheck synccheck; do
        run "san-fwd2-$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$repo/tools/sanitize_cases.py" ssd_fwd2
      done
      ;;
    timepipe)
      ab pipe-on pipe-off FLASHSCAN_SSD_SCAN_WS_PIPE
      grep -HE "^## |chunk_scan" "$L"/pipe-o*.log >"$OUT/pipe-summary.txt"
      ;;
    timebwd)
      ab step-fused step-pair FLASHSCAN_SSD_BWD_STATE_PASS
      grep -HE "^## |state|dstate" "$L"/step-*.log >"$OUT/time-summary.txt"
      ;;
    ncu)
      S=(--section SpeedOfLight --section SchedulerStats --section WarpStateStats
        --section Occupancy --section MemoryWorkloadAnalysis --section SourceCounters)
      for k in ssd2_chunk_scan_ws ssd2_chunk_scan_ws_pipe ssd2_chunk_state_pass; do
        pipe=0
        [ "$k" = ssd2_chunk_scan_ws_pipe ] && pipe=1
        run "ncu-$k" 150 env FLASHSCAN_SSD_SCAN_WS_PIPE=$pipe ncu --profile-from-start off "${S[@]}" \
          -k "regex:^$k\$" -c 1 python3 "$prof" --shape 2k --paths 2 --ncu-range fwd
      done
      for k in ssd_bwd_dstate_pass ssd_bwd_chunk_dx16; do
        run "ncu-$k" 150 "${on[@]}" ncu --profile-from-start off "${S[@]}" -k "regex:^$k\$" -c 1 \
          python3 "$prof" --shape 2k --paths 2 --ncu-range step
      done
      grep -HE "Duration|Throughput|Busy|Eligible|Issued Warp|Registers|Achieved Occ|Warp Cycles" \
        "$L"/ncu-*.log >"$OUT/ncu-summary.txt"
      ;;
    triton)
      run triton 560 python3 "$repo/benches/ssd.py" --mamba-src "$repo/.dev/peers/mamba" \
        --fwd-paths 2 --bwd-paths 2 --shapes 2k,real --out "$OUT"
      ;;
    *)
      echo "unknown stage $stage" >&2
      exit 2
      ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
