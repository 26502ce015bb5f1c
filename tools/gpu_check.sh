#!/usr/bin/env bash
# One call on the GPU machine: install the wheel built here, then run the stages asked for
# (default: all) and leave logs under $OUT. Used through the device tool, e.g.
#   bash tools/gpu_check.sh tests sanitize bench-quick
# with `.dev/wheel` carried (the wheel from `maturin build --release -o .dev/wheel`).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info tests sanitize bench-quick)

# --upgrade: on a warm machine pip --target otherwise keeps the previously installed wheel
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site .dev/wheel/flashscan-*.whl || exit 1
export PYTHONPATH=/tmp/site
export FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache
export FLASHSCAN_COMMIT="$(cat .dev/wheel/COMMIT 2>/dev/null || echo unknown)"
cd /tmp  # import the installed wheel, not python/ of the tree
repo="$OLDPWD"

for stage in "${stages[@]}"; do
  echo "=== $stage"
  case "$stage" in
    info)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
      python3 -m flashscan info 2>&1 | tee "$OUT/info.log"
      ;;
    precompile)
      t0=$SECONDS
      python3 -m flashscan precompile --all 2>&1 | tr '\r' '\n' | tail -3 | tee "$OUT/precompile.log"
      echo "precompile --all: $((SECONDS - t0)) s wall" | tee -a "$OUT/precompile.log"
      ;;
    tests)
      python3 -m pytest "$repo/tests" -m gpu -q -p no:cacheprovider --maxfail=25 --durations=15 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -60
      ;;
    tests-all)
      python3 -m pytest "$repo/tests" -q -p no:cacheprovider --durations=15 2>&1 \
        | tee "$OUT/all_tests.log" | tail -60
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$repo/tools/sanitize_cases.py" 2>&1 | tee "$OUT/sanitize_$tool.log" | tail -8
        echo "compute-sanitizer $tool exit: ${PIPESTATUS[0]}"
      done
      ;;
    bench-quick)
      python3 "$repo/benches/compare.py" --quick --out "$OUT/bench" 2>"$OUT/bench_progress.log" | tail -80
      ;;
    bench)
      python3 "$repo/benches/compare.py" --out "$OUT/bench" 2>"$OUT/bench_progress.log" | tail -120
      ;;
    bench-backward)
      python3 "$repo/benches/backward.py" --out "$OUT/bench_backward" 2>&1 \
        | tee "$OUT/bench_backward.log" | tail -50
      ;;
    *)
      # anything else: a python script path relative to the repo and its arguments, as one
      # stage ("tools/profile_overhead.py --backward"), with its output logged
      read -r -a cmd <<< "$stage"
      python3 "$repo/${cmd[0]}" "${cmd[@]:1}" 2>&1 | tee "$OUT/$(basename "${cmd[0]}").log" | tail -80
      ;;
  esac
done
