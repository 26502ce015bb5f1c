#!/usr/bin/env bash
# The GPU calls the SSD's opt-in sm_90a kernels wait for (written in a session lent no device,
# 2026-12-04): the forward's chunk states on clusters sharing B (`ssd2_chunk_state_pass_mc`,
# FLASHSCAN_SSD_STATE_CLUSTER=1) and the backward's L_c + reverse state passing in one kernel
# (`ssd_bwd_dstate_pass`, FLASHSCAN_SSD_BWD_STATE_PASS=1). On an H100 / H200 with the wheel built
# here carried in .dev/wheel (bash tools/build_wheel.sh) and, for `triton`, the mamba snapshot in
# .dev/peers/mamba. Stages (each Python run killed after its limit, so a hang shows as rc 137;
# the device tool allows 600 s a command, so split them over calls on one warm machine):
#   bash tools/ssd_pending_gpu.sh quick check      (< 450 s)
#   bash tools/ssd_pending_gpu.sh time             (< 450 s)
#   bash tools/ssd_pending_gpu.sh sanitize         (< 550 s; before a default is flipped)
#   bash tools/ssd_pending_gpu.sh triton           (< 600 s: the Triton backward's autotune)
#   quick     the two kernels' own tests, each form against float64 under the rule and the
#             kernels launched against the switches: a wrong index shows in seconds
#   check     every SSD GPU test with both switches on (the helpers that name the expected
#             kernels read them), then with both off
#   sanitize  memcheck / racecheck of tools/sanitize_cases.py ssd_fwd2 (bf16 on clusters) and
#             ssd_bwd_pass (the fused backward kernel), synccheck of the latter
#   time      tools/ssd_profile.py b8 L2048 80 x 64, state 128: the forward with and without
#             clusters, the forward + backward with and without the fused backward kernel, two
#             alternations each; L8192 forward once each way
#   triton    benches/ssd.py beside mamba_ssm's Triton SSD (forward and forward + backward, each
#             row guarded), both switches on
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
on=(env FLASHSCAN_SSD_STATE_CLUSTER=1 FLASHSCAN_SSD_BWD_STATE_PASS=1)
off=(env FLASHSCAN_SSD_STATE_CLUSTER=0 FLASHSCAN_SSD_BWD_STATE_PASS=0)
tests=("$repo/tests/test_ssd_gpu.py" "$repo/tests/test_ssd.py")
prof="$repo/tools/ssd_profile.py"
for stage in "${stages[@]}"; do
  case "$stage" in
    quick)
      run quick 200 python3 -m pytest "${tests[0]}" -q -p no:cacheprovider -n 4 \
        -k "fused_state_passing"
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
      for r in 1 2; do
        run "fwd-single-$r" 60 "${off[@]}" python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
        run "fwd-cluster-$r" 60 "${on[@]}" python3 "$prof" --shape 2k --reps 4 --paths 2 --fwd-only
        run "step-pair-$r" 90 "${off[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
        run "step-fused-$r" 90 "${on[@]}" python3 "$prof" --shape 2k --reps 3 --paths 2
      done
      run fwd-single-8k 60 "${off[@]}" python3 "$prof" --shape 8k --reps 3 --paths 2 --fwd-only
      run fwd-cluster-8k 60 "${on[@]}" python3 "$prof" --shape 8k --reps 3 --paths 2 --fwd-only
      grep -HE "^## |state" "$L"/fwd-*.log "$L"/step-*.log >"$OUT/time-summary.txt"
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
