#!/usr/bin/env python3
"""Training-path benchmark (issue 6): attention forward+backward and the selective-scan
backward, flashscan against torch SDPA's FlashAttention-2 and cuDNN backends in the same run.

    python benches/backward.py [--quick] [--out DIR] [--suite attention,scan]

Results go to benches/results/<YYYY-MM-DD>-<gpu>-backward[-quick]/ (results.md, results.json)
unless --out says otherwise. The logic lives in `flashscan.bench.training` (one timer and one
set of correctness guards with `python -m flashscan bench`): every timed row is checked against
float64 at every seqlen and prints FAILED when it is off, not finite or could not be checked.
The installed flashscan is used when importable, else the package in this checkout's python/.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_main() -> Callable[..., int]:
    try:
        from flashscan.bench.training import main
    except ImportError:
        # Not installed (or an installed version without it): use this checkout's.
        for name in [m for m in sys.modules if m == "flashscan" or m.startswith("flashscan.")]:
            del sys.modules[name]
        sys.path.insert(0, os.path.join(REPO, "python"))
        from flashscan.bench.training import main
    return main


if __name__ == "__main__":
    sys.exit(_load_main()(results_root=os.path.join(REPO, "benches", "results")))
