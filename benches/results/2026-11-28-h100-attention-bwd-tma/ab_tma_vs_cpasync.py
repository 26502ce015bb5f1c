"""The attention backward alone: its TMA build vs its cp.async build (FLASHSCAN_SM90_BWD_TMA = 1
/ 0, read per call), alternated three times in one process, beside cuDNN's backward (SDPA
fwd+bwd minus fwd). TFLOP/s in flash-attn's convention (2.5x the forward's FLOPs)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan

SHAPES = [
    (4, 4096, 16, 128, False),
    (4, 4096, 16, 128, True),
    (4, 4096, 32, 64, False),
    (4, 4096, 32, 64, True),
    (8, 2048, 16, 128, False),
    (2, 8192, 16, 128, False),
]


def ev(fn: Callable[[], object], reps: int = 30) -> float:
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


def step(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, dt: torch.Tensor, causal: bool
) -> object:
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return torch.autograd.grad(o, (qt, kt, vt), dt)


def main() -> None:
    for b, s, h, d, causal in SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out, lse = flashscan.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        dout = torch.randn_like(out)
        g = [torch.empty_like(t) for t in (q, k, v)]
        st = torch.cuda.current_stream().cuda_stream
        flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
        right = 0 if causal else -1
        fn = functools.partial(
            flashscan._native.flash_attn_bwd,
            *(dout, q, k, v, out, lse, *g),
            *(d**-0.5, -1, right, 0.0, False, st),
        )
        row = []
        for _ in range(3):
            for val in ("1", "0"):
                os.environ["FLASHSCAN_SM90_BWD_TMA"] = val
                us = ev(fn)
                row.append(f"{'tma' if val == '1' else 'cpa'} {flops / us / 1e6:.0f}")
        os.environ.pop("FLASHSCAN_SM90_BWD_TMA")
        qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            fwd = functools.partial(F.scaled_dot_product_attention, qt, kt, vt, is_causal=causal)
            cu = ev(functools.partial(step, qt, kt, vt, dout.transpose(1, 2), causal)) - ev(fwd)
        print(
            f"b{b} s{s} h{h} d{d} causal={int(causal)} TFLOP/s | "
            + " | ".join(row)
            + f" | cudnn {flops / cu / 1e6:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
