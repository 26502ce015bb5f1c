#!/usr/bin/env bash
# (The record's copy of tools/ssd_pending_gpu.sh at 2039361, branch wsg: its temporary-directory
# paths written <tmp> here; the run used /tmp on the device.)
# The GPU calls the SSD's opt-in sm_90a kernels wait for (written in sessions lent no device,
# 2026-12-04 / 05): the forward's chunk states on clusters sharing B (`ssd2_chunk_state_pass_mc`,
# FLASHSCAN_SSD_STATE_CLUSTER=1), the forward's chunk outputs with C and C B^T shared by three
# heads (`ssd2_chunk_scan_wsg`, FLASHSCAN_SSD_SCAN_SHARED=1) and the backward's L_c + reverse
# state passing in one kernel (`ssd_bwd_dstate_pass`, FLASHSCAN_SSD_BWD_STATE_PASS=1), and the
# backward's dx warp-specialised (`ssd_bwd_chunk_dx16_ws`, FLASHSCAN_SSD_DX_WS=1). On an
# H100 / H200 with the wheel built here carried in .dev/wheel (bash tools/build_wheel.sh) and, for
# `triton`, the mamba snapshot in .dev/peers/mamba. Stages (each Python run killed after its
# limit, so a hang shows as rc 137; the device tool allows 600 s a command, so split them over
# calls on one warm machine):
#   bash tools/ssd_pending_gpu.sh quick timefast   (< 560 s: the first call of a short budget)
#   bash tools/ssd_pending_gpu.sh quick check      (< 500 s)
#   bash tools/ssd_pending_gpu.sh time             (< 500 s)
#   bash tools/ssd_pending_gpu.sh timebwd sanitize (< 550 s; before a default is flipped)
#   bash tools/ssd_pending_gpu.sh triton           (< 600 s: the Triton backward's autotune)
#   quick     the four kernels' own tests, each form against float64 under the rule and the
#             kernels launched against the switches: a wrong index shows in seconds
#   check     every SSD GPU test with the four switches on (the helpers that name the expected
#             kernels read them), then with them off
#   sanitize  memcheck / racecheck of tools/sanitize_cases.py ssd_fwd2 (bf16 on clusters and the
#             shared chunk outputs) and ssd_bwd_pass (the fused backward kernel), synccheck of the
#             latter
#   time      tools/ssd_profile.py b8 L2048 80 x 64, state 128: the forward with neither forward
#             switch, each alone and both, two alternations; L8192 neither and both
#   timefast  one alternation: the forward with neither forward switch, each alone, all four on
#             (beside mamba_ssm's Triton forward in that process); the step all off and all on
#   timebwd   the forward + backward with neither backward switch, each alone, two alternations
#   ncu       one launch each of the forward's chunk outputs and chunk states, both forms, and of
#             the backward's fused state kernel (SpeedOfLight, scheduler, warp states, memory)
#   triton    benches/ssd.py beside mamba_ssm's Triton SSD (forward and forward + backward, each
#             row guarded), the four switches on
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-${TMPDIR:-<tmp>}/flashscan-out}"
L="$OUT/logs"  # (tarred at the end: the device tool brings back at most 8 files)
mkdir -p "$L"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(quick check)
rm -rf ${TMPDIR:-<tmp>}/site  # (a warm machine keeps the last call's package)
python3 -m pip install -q --no-deps --no-index --target ${TMPDIR:-<tmp>}/site .dev/wheel/flashscan-*.whl \
  .dev/pydeps/*.whl || exit 1
repo="$PWD"
export PYTHONPATH=${TMPDIR:-<tmp>}/site FLASHSCAN_CACHE_DIR=${TMPDIR:-<tmp>}/flashscan-cache-ssd
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
on=(env FLASHSCAN_SSD_STATE_CLUSTER=1 FLASHSCAN_SSD_BWD_STATE_PASS=1 FLASHSCAN_SSD_SCAN_SHARED=1
  FLASHSCAN_SSD_DX_WS=1)
off=(env FLASHSCAN_SSD_STATE_CLUSTER=0 FLASHSCAN_SSD_BWD_STATE_PASS=0 FLASHSCAN_SSD_SCAN_SHARED=0
  FLASHSCAN_SSD_DX_WS=0)
tests=("$repo/tests/test_ssd_gpu.py" "$repo/tests/test_ssd.py")
prof="$repo/tools/ssd_profile.py"
for stage in "${stages[@]}"; do
  case "$stage" in
    quick)
      run quick 240 python3 -m pytest "${tests[0]}" -q -p no:cacheprovider -n 4 \
        -k "fused_state_passing or warp_specialised"
      ;;
    check)
      run check-on 240 "${on[@]}" python3 -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider -n 8
      run check-off 240 "${off[@]}" python3 -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider -n 8
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        run "san-$tool" 200 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$repo/tools/sanitize_cases.py" ssd_fwd2 ssd_bwd_pass
      done
      run san-synccheck 120 compute-sanitizer --tool synccheck --error-exitcode 9 \
        python3 "$repo/tools/sanitize_cases.py" ssd_bwd_pass
      ;;
    time)
      # the forward: neither, each alone, both; two alternations
      for r in 1 2; do
        run "fwd-single-$r" 60 "${off[@]}" python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
        run "fwd-cluster-$r" 60 "${off[@]}" FLASHSCAN_SSD_STATE_CLUSTER=1 \
          python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
        run "fwd-shared-$r" 60 "${off[@]}" FLASHSCAN_SSD_SCAN_SHARED=1 \
          python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
        run "fwd-both-$r" 60 "${on[@]}" python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
      done
      run fwd-single-8k 60 "${off[@]}" python3 "$prof" --shape 8k --reps 3 --paths 2 --fwd-only
      run fwd-both-8k 60 "${on[@]}" python3 "$prof" --shape 8k --reps 3 --paths 2 --fwd-only
      grep -HE "^## |state|scan" "$L"/fwd-*.log >"$OUT/time-summary.txt"
      ;;
    timefast)
      # one alternation: the forward with neither forward switch, each alone, all on (with
      # mamba_ssm's Triton forward in that process); the step with every switch off and on
      run fwd-single 60 "${off[@]}" python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
      run fwd-cluster 60 "${off[@]}" FLASHSCAN_SSD_STATE_CLUSTER=1 \
        python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
      run fwd-shared 60 "${off[@]}" FLASHSCAN_SSD_SCAN_SHARED=1 \
        python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
      run fwd-both 90 "${on[@]}" python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only \
        --mamba-src "$repo/.dev/peers/mamba"
      run step-off 90 "${off[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
      run step-on 90 "${on[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
      grep -HE "^## |state|scan|dx16" "$L"/fwd-*.log "$L"/step-*.log >"$OUT/time-summary.txt"
      ;;
    timebwd)
      for r in 1 2; do
        run "step-pair-$r" 90 "${off[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
        run "step-fused-$r" 90 "${off[@]}" FLASHSCAN_SSD_BWD_STATE_PASS=1 \
          python3 "$prof" --shape 2k --reps 3 --paths 2
        run "step-dxws-$r" 90 "${off[@]}" FLASHSCAN_SSD_DX_WS=1 \
          python3 "$prof" --shape 2k --reps 3 --paths 2
      done
      grep -HE "^## |state|dstate" "$L"/step-*.log >"$OUT/timebwd-summary.txt"
      ;;
    ncu)
      # one launch each of the forward's chunk outputs (both forms) and chunk states (both forms)
      # and of the backward's fused state kernel, with the sections that say what holds them
      S=(--section SpeedOfLight --section SchedulerStats --section WarpStateStats
        --section Occupancy --section MemoryWorkloadAnalysis)
      for k in ssd2_chunk_scan_ws ssd2_chunk_state_pass; do
        run "ncu-$k" 150 "${on[@]}" FLASHSCAN_SSD_SCAN_SHARED=0 FLASHSCAN_SSD_STATE_CLUSTER=0 \
          ncu --profile-from-start off "${S[@]}" -k "regex:^$k\$" -c 1 \
          python3 "$prof" --shape 2k --paths 2 --ncu-range fwd
      done
      for k in ssd2_chunk_scan_wsg ssd2_chunk_state_pass_mc; do
        run "ncu-$k" 150 "${on[@]}" ncu --profile-from-start off "${S[@]}" -k "regex:^$k\$" -c 1 \
          python3 "$prof" --shape 2k --paths 2 --ncu-range fwd
      done
      run ncu-ssd_bwd_dstate_pass 150 "${on[@]}" ncu --profile-from-start off "${S[@]}" \
        -k "regex:ssd_bwd_dstate_pass" -c 1 python3 "$prof" --shape 2k --paths 2 --ncu-range step
      grep -HE "Duration|Throughput|Busy|Eligible|Issued Warp|Registers|Achieved Occ|Warp Cycles" \
        "$L"/ncu-*.log >"$OUT/ncu-summary.txt"
      ;;
    triton)
      run triton 580 "${on[@]}" python3 "$repo/benches/ssd.py" --mamba-src "$repo/.dev/peers/mamba" \
        --fwd-paths 2 --bwd-paths 2 --out "$OUT"
      ;;
    *)
      echo "unknown stage $stage" >&2
      exit 2
      ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
