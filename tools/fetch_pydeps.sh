#!/usr/bin/env bash
# Fills .dev/pydeps (git-ignored) with the wheels of transformers and its dependencies (and of
# pytest-xdist) for the GPU machine, which reaches no package index: tools/gpu_check.sh
# installs them with --no-deps beside the flashscan wheel. Targets that machine's CPython 3.12
# on x86-64 Linux. What torch already brings there (numpy, filelock, fsspec) is left out, so
# that the copies installed ahead of site-packages on PYTHONPATH cannot shadow torch's own.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .dev/pydeps && mkdir -p .dev/pydeps
python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .dev/pydeps "transformers>=5.23,<6"
# pytest-xdist: the tests stage runs the GPU suite in parallel processes (2-3x less device time)
python3 -m pip download -q --no-deps -d .dev/pydeps "pytest-xdist>=3.5" "execnet>=2.1"
rm -f .dev/pydeps/numpy-*.whl .dev/pydeps/filelock-*.whl .dev/pydeps/fsspec-*.whl
du -sh .dev/pydeps
