#!/usr/bin/env bash
# One call on the GPU machine: install the wheel built here, then run the stages asked for
# (default: info tests sanitize bench-quick) and leave logs under $OUT. Used through the device
# tool, e.g.
#   bash tools/gpu_check.sh precompile tests sanitize bench-quick base-bench-quick pack
# On 2+ GPUs (nvidia-h200-x2): bash tools/gpu_check.sh info multi-gpu multi-gpu-sanitize pack
# The second SSD forward (FLASHSCAN_SSD_FWD=2) alone: bash tools/gpu_check.sh info ssd-fwd2 pack
# with `.dev/wheel` carried (`bash tools/build_wheel.sh`). Optional carried folders:
#   .dev/pydeps      wheels the machine lacks (tools/fetch_pydeps.sh): transformers for the
#                    tests-transformers and bench-transformers[-quick] stages
#   .dev/wheel-base  an earlier wheel: the base-* stages time it in the same run (before/after)
#   .peers/mamba     a mamba source checkout: the bench stages build and time mamba_ssm beside us
#   .peers/causal-conv1d  a causal-conv1d checkout: bench-conv1d builds and times it beside us
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/flashscan-out}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info tests sanitize bench-quick)

# --upgrade: on a warm machine pip --target otherwise keeps the previously installed wheel
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site .dev/wheel/flashscan-*.whl || exit 1
if ls .dev/wheel-base/flashscan-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site-base .dev/wheel-base/flashscan-*.whl || exit 1
  # this tree's Python layer over the earlier wheel's native core: isolates the kernels and Rust
  rm -rf /tmp/site-mixed && cp -r /tmp/site /tmp/site-mixed
  cp /tmp/site-base/flashscan/_native*.so /tmp/site-mixed/flashscan/
fi
export PYTHONPATH=/tmp/site
# .dev/pydeps (optional, carried; filled by tools/fetch_pydeps.sh): wheels of pure-Python
# dependencies the machine lacks (transformers and its own), for the transformers stages
if ls .dev/pydeps/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site-deps .dev/pydeps/*.whl || exit 1
  export PYTHONPATH=/tmp/site:/tmp/site-deps
fi
export FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache
export FLASHSCAN_COMMIT="$(cat .dev/wheel/COMMIT 2>/dev/null || echo unknown)"
base_commit="$(cat .dev/wheel-base/COMMIT 2>/dev/null || echo unknown)"
mamba=()
[ -d .peers/mamba/mamba_ssm ] && mamba=(--mamba-src "$PWD/.peers/mamba" --mamba-build /tmp/mamba-build)
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
      # with pytest-xdist (carried in .dev/pydeps) six processes share the GPU: ~2.5x faster;
      # jax must not preallocate then (one worker would take 75% of the memory)
      par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 6)
      XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest "$repo/tests" -m gpu -q -p no:cacheprovider \
        "${par[@]}" --maxfail=25 --durations=15 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
      ;;
    tests-all)
      python3 -m pytest "$repo/tests" -q -p no:cacheprovider --durations=15 2>&1 \
        | tee "$OUT/all_tests.log" | tail -60
      ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 "$repo/tools/sanitize_cases.py" 2>&1 | tee "$OUT/sanitize_$tool.log" | tail -8
        echo "compute-sanitizer $tool exit: ${PIPESTATUS[0]}"
      done
      ;;
    tests-transformers)
      # FLASHSCAN_FALLBACK=error: a call that would leave the kernels for the host fails the test
      FLASHSCAN_FALLBACK=error python3 -m pytest "$repo/tests/test_integrations_transformers.py" -q -p no:cacheprovider \
        --durations=10 2>&1 | tee "$OUT/transformers_tests.log" | tail -40
      ;;
    bench-transformers|bench-transformers-quick)
      quick=(); [ "$stage" = bench-transformers-quick ] && quick=(--quick)
      python3 "$repo/benches/transformers_generate.py" "${quick[@]}" --out "$OUT/bench_transformers" \
        2>&1 | tee "$OUT/bench_transformers.log" | tail -40
      ;;
    bench-quick)
      python3 "$repo/benches/compare.py" --quick --no-plots "${mamba[@]}" --out "$OUT/bench" \
        2>"$OUT/bench_progress.log" | tail -80
      ;;
    bench)
      python3 "$repo/benches/compare.py" "${mamba[@]}" --out "$OUT/bench" 2>"$OUT/bench_progress.log" | tail -120
      ;;
    bench-conv1d|bench-conv1d-quick)
      quick=(); [ "$stage" = bench-conv1d-quick ] && quick=(--quick)
      conv=(); [ -d "$repo/.peers/causal-conv1d/csrc" ] && conv=(--conv1d-src "$repo/.peers/causal-conv1d" --conv1d-build /tmp/conv1d-build)
      python3 "$repo/benches/conv1d.py" "${quick[@]}" "${conv[@]}" --out "$OUT/bench_conv1d" 2>&1 \
        | tee "$OUT/bench_conv1d.log" | tail -40
      ;;
    jax)
      # flashscan.jax: the CPU suite, the GPU suite (jit == eager, grads, training step), and
      # attention in jax.jit vs jax.nn.dot_product_attention (cudnn, xla) in the same run
      XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest "$repo/tests/test_jax.py" \
        "$repo/tests/test_jax_gpu.py" -q -p no:cacheprovider --durations=10 2>&1 \
        | tee "$OUT/jax_tests.log" | tail -40
      python3 "$repo/benches/jax_attention.py" --out "$OUT/bench_jax" 2>&1 | tee "$OUT/bench_jax.log" | tail -30
      ;;
    bench-backward|bench-backward-quick)
      quick=(); [ "$stage" = bench-backward-quick ] && quick=(--quick)
      python3 "$repo/benches/backward.py" "${quick[@]}" "${mamba[@]}" --out "$OUT/bench_backward" 2>&1 \
        | tee "$OUT/bench_backward.log" | tail -50
      ;;
    base-bench-quick)
      # the earlier wheel whole (its own harness and Python layer), same run, same machine
      FLASHSCAN_COMMIT="$base_commit" PYTHONPATH=/tmp/site-base FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache-base \
        python3 -m flashscan bench --quick --no-plots --out "$OUT/bench_base" 2>"$OUT/bench_base_progress.log" | tail -80
      ;;
    base-bench-backward-quick)
      FLASHSCAN_COMMIT="$base_commit (native core; Python layer of $FLASHSCAN_COMMIT)" PYTHONPATH=/tmp/site-mixed \
        FLASHSCAN_CACHE_DIR=/tmp/flashscan-cache-base python3 "$repo/benches/backward.py" --quick \
        --out "$OUT/bench_backward_base" 2>&1 | tee "$OUT/bench_backward_base.log" | tail -50
      ;;
    multi-gpu)
      # issue 15 on a machine with >= 2 GPUs (nvidia-h200-x2): any-device tests, ring attention
      # and the sharded scan under NCCL (tests/ring_cases.py through torchrun), then the bench
      export NCCL_NVLS_ENABLE=0
      nvidia-smi topo -m 2>&1 | tee "$OUT/topo.log" | head -12
      python3 -m pytest "$repo/tests/test_multi_gpu.py" "$repo/tests/test_distributed.py" -q \
        -p no:cacheprovider -rs 2>&1 | tee "$OUT/multi_gpu_tests.log" | tail -30
      ngpu="$(python3 -c 'import torch; print(torch.cuda.device_count())')"
      python3 -m torch.distributed.run --standalone --nproc-per-node "$ngpu" "$repo/benches/ring.py" \
        --out "$OUT/bench_ring" 2>&1 | grep -v '^W[0-9]' | tee "$OUT/bench_ring.log" | tail -30
      ;;
    multi-gpu-sanitize)
      # ring attention and the sharded scan with rank 0 under compute-sanitizer memcheck (rank 1
      # plain): the kernels on the ring's strided shard views, NCCL left alone on the other rank
      export NCCL_NVLS_ENABLE=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 WORLD_SIZE=2
      RANK=1 LOCAL_RANK=1 python3 "$repo/tests/ring_cases.py" --quick > "$OUT/sanitize_ring_rank1.log" 2>&1 &
      RANK=0 LOCAL_RANK=0 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 "$repo/tests/ring_cases.py" --quick 2>&1 | tee "$OUT/sanitize_ring_memcheck.log" | tail -8
      echo "compute-sanitizer memcheck (ring, rank 0) exit: ${PIPESTATUS[0]}"
      wait
      ;;
    ssd-fwd2)
      # issue 14's second SSD forward (FLASHSCAN_SSD_FWD=2, cuda/ssd_fwd2.cu) in one call: the SSD
      # forward GPU tests under both paths, its kernels under memcheck / racecheck / synccheck,
      # then both paths timed beside mamba_ssm's Triton SSD (benches/ssd.py --fwd-paths 1,2)
      python3 -m pytest "$repo/tests/test_ssd_gpu.py" -q -p no:cacheprovider -k "not backward" -rs \
        2>&1 | tee "$OUT/ssd_fwd2_tests.log" | tail -30
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 9 python3 "$repo/tools/sanitize_cases.py" ssd_fwd2 \
          2>&1 | tee "$OUT/sanitize_ssd_fwd2_$tool.log" | tail -8
        echo "compute-sanitizer $tool (ssd_fwd2) exit: ${PIPESTATUS[0]}"
      done
      python3 "$repo/benches/ssd.py" "${mamba[@]:0:2}" --fwd-paths 1,2 --out "$OUT/bench_ssd" \
        2>"$OUT/bench_ssd_progress.log" | tail -20
      ;;
    bench-ssd)
      # Mamba-2 SSD forward vs mamba_ssm's Triton SSD (the checkout needs no build)
      python3 "$repo/benches/ssd.py" "${mamba[@]:0:2}" --out "$OUT/bench_ssd" \
        2>"$OUT/bench_ssd_progress.log" | tail -20
      ;;
    pack)
      # the device tool returns at most 8 files: everything else in one archive
      (cd "$OUT" && tar czf /tmp/logs.tgz --exclude=logs.tgz . && rm -rf ./* && mv /tmp/logs.tgz .)
      ;;
    *)
      # anything else: a python script path relative to the repo and its arguments, as one
      # stage ("tools/profile_overhead.py --backward"), with its output logged
      read -r -a cmd <<< "$stage"
      python3 "$repo/${cmd[0]}" "${cmd[@]:1}" 2>&1 | tee "$OUT/$(basename "${cmd[0]}").log" | tail -80
      ;;
  esac
done
