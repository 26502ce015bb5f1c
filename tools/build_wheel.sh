#!/usr/bin/env bash
# Builds the release wheel into .dev/wheel (git-ignored) for the GPU machine, which has no Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .dev/wheel && mkdir -p .dev/wheel
python3 -m maturin build --release --zig --compatibility manylinux2014 -o .dev/wheel >/dev/null
git rev-parse --short HEAD > .dev/wheel/COMMIT
if ! git diff --quiet HEAD -- src cuda python; then echo "+dirty" >> .dev/wheel/COMMIT; fi
ls .dev/wheel
