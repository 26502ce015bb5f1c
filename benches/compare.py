#!/usr/bin/env python3
"""Time flashscan against every peer present (torch SDPA backends, flash-attn, mamba_ssm, plain
torch, the NumPy reference) in one run on this GPU.

    python benches/compare.py [--quick] [--suite attention,latency,scan,state_update|all|none]
                              [--out DIR] [--cold-start] [--no-plots] [--seed N]

Results go to benches/results/<YYYY-MM-DD>-<gpu>[-quick]/ (results.md, results.json, PNG plots)
unless --out says otherwise. The logic lives in `flashscan.bench` (it ships in the wheel, and
`python -m flashscan bench` runs the same). The installed flashscan is used when importable,
else the package in this checkout's python/ directory. Without torch or a CUDA GPU the harness
says so and exits 0.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_main() -> Callable[..., int]:
    try:
        from flashscan.bench import main
    except ImportError:
        # Not installed (or an installed version without the harness): use this checkout's.
        for name in [m for m in sys.modules if m == "flashscan" or m.startswith("flashscan.")]:
            del sys.modules[name]
        sys.path.insert(0, os.path.join(REPO, "python"))
        from flashscan.bench import main
    return main


if __name__ == "__main__":
    sys.exit(_load_main()(results_root=os.path.join(REPO, "benches", "results")))
