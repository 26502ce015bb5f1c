"""Peer-comparison benchmark: flashscan against every peer present, in one run, on the GPU here.

    python benches/compare.py [--quick] [--suite attention,latency,scan,state_update|all|none]
                              [--out DIR] [--cold-start] [--no-plots] [--seed N]
    (`python -m flashscan bench` takes the same arguments.)

What one run does:

1. Measures two ceilings of this GPU: device copy bandwidth (a 1 GiB device-to-device copy,
   512 MiB with --quick; bytes read + bytes written) and bf16 matmul rate (torch.mm of large
   squares, 2*m^3 FLOPs), plus, when Triton is importable, the exp2 rate of the special-function
   units (a Triton kernel of independent ex2.approx chains), because the selective scan computes
   one exponential per (batch, channel, step, state) and can be bound by them.
2. Runs the suites. Every row gets its floor: max(FLOPs / matmul rate, bytes / copy bandwidth,
   exponentials / exp2 rate), and the ratio measured time / floor.
3. Times flashscan and the peers on the same random inputs (never zeros), rotating among several
   input sets when one set would fit in L2; GPU time is the median of per-call CUDA-event
   timings with L2 flushed before each call (triton.testing.do_bench with return_mode="median"
   when Triton is importable, the same method with torch events otherwise). Latency rows add
   wall time per call from Python (back-to-back calls, then one synchronize), wall time of one
   call followed by a synchronize, and CUDA-graph replays.
4. Guards correctness: before a row is timed, its output is compared with a float64 torch
   reference on a subset (rows of queries, channels of the scan) and the row is marked FAILED
   when it is off by more than a loose tolerance: a fast wrong kernel must not look good.
5. Writes `<out>/results.md` (also printed), `<out>/results.json` (raw numbers) and PNG plots
   when matplotlib is importable.

Peers: torch SDPA per backend (flash, cuDNN, efficient, math where the score matrix is small),
flash-attn (2 and 3) and mamba_ssm when importable, a plain torch selective scan (a sequential
loop: only at short seqlen), a plain torch state update, and the NumPy reference at tiny shapes.
mamba_ssm anchors measured on the same H100 model are shown beside our rows, labelled as not
measured in this run.

This module imports only the standard library at import time: torch, triton and matplotlib
are imported when a run needs them, so a machine without them gets a message, not a crash.

Modules (one concern each): `cli` (options, the run, the files written), `config` (suites,
shapes, budgets, anchors), `costs` (work counts and floors), `timing` (Timer), `ceilings`
(copy / matmul / exp2 rates), `references` (torch references), `guards` (correctness guards),
`peers` (what competes at a shape), `runner` (guard + time one implementation), `suites`,
`cold` (cold start), `report` (markdown), `plots`, `meta` (run metadata without local paths),
`training` (forward + backward: `benches/backward.py`).
"""

from __future__ import annotations

from .cli import main
from .cold import cold_check
from .references import torch_selective_scan, torch_state_update

__all__ = ["cold_check", "main", "torch_selective_scan", "torch_state_update"]
