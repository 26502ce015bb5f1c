"""The attention backward alone (native entry, CUDA events, median of 30) beside cuDNN's and
FlashAttention-2's (SDPA fwd+bwd minus fwd), as run in calls 1-4 of this record.

Call 1 ran it on a throwaway build whose kernel read FLASHSCAN_SM90_BWD_EXP (ablation bits, see
README.md: timing only, wrong results on purpose); on main that variable does nothing.
    python bwd_time.py [EXP,EXP,...]"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan

SHAPES = [
    (4, 4096, 16, 128, False),
    (4, 4096, 16, 128, True),
    (4, 4096, 32, 64, False),
    (8, 2048, 16, 128, False),
]


def ev_time(fn: Callable[[], object], reps: int = 30) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def _step(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, dt: torch.Tensor, causal: bool
) -> object:
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return torch.autograd.grad(out, (qt, kt, vt), dt)


def main() -> None:
    exps = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [0]
    for b, s, h, d, causal in SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out, lse = flashscan.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        dout = torch.randn_like(out)
        grads = [torch.empty_like(t) for t in (q, k, v)]
        stream = torch.cuda.current_stream().cuda_stream
        flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
        right = 0 if causal else -1

        ours = functools.partial(
            flashscan._native.flash_attn_bwd,
            dout,
            q,
            k,
            v,
            out,
            lse,
            *grads,
            d**-0.5,
            -1,
            right,
            0.0,
            False,
            stream,
        )

        row = []
        for e in exps:
            os.environ["FLASHSCAN_SM90_BWD_EXP"] = str(e)
            us = ev_time(ours)
            row.append(f"exp{e}: {us:.0f} us {flops / us / 1e6:.0f} TF")
        os.environ.pop("FLASHSCAN_SM90_BWD_EXP")
        qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
        dt = dout.transpose(1, 2)

        fwd = functools.partial(F.scaled_dot_product_attention, qt, kt, vt, is_causal=causal)
        step = functools.partial(_step, qt, kt, vt, dt, causal)
        peers = []
        for name, backend in (
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("fa2", SDPBackend.FLASH_ATTENTION),
        ):
            with sdpa_kernel(backend):
                us = ev_time(step) - ev_time(fwd)
            peers.append(f"{name} bwd {us:.0f} us {flops / us / 1e6:.0f} TF")
        print(f"b{b} s{s} h{h} d{d} causal={int(causal)} | " + " | ".join(row + peers), flush=True)


if __name__ == "__main__":
    main()
