"""Kernel time of causal_conv1d_update (bf16, width 4, bias, SiLU, one new input) per shape, by
torch.profiler (flashscan.bench.timing.kernel_us, the update kernel alone), for A/B of wheels."""

import sys

import torch

import flashscan
from flashscan.bench.timing import kernel_us

tag = sys.argv[1]
for b, d, ring in [(64, 5376, False), (256, 5376, False), (32, 640, False), (256, 5376, True)]:
    x = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
    st = torch.randn(b, d, 3, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(d, 4, device="cuda", dtype=torch.bfloat16) / 4
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    lens = torch.randint(0, 50, (b,), device="cuda", dtype=torch.int32) if ring else None

    def fn(x=x, st=st, w=w, bias=bias, lens=lens):
        return flashscan.causal_conv1d_update(x, st, w, bias, activation="silu", cache_seqlens=lens)

    us = kernel_us(torch, fn, reps=50, warm=5, keep=lambda k: "causal_conv1d_update" in k)
    print(f"{tag} update b{b} d{d} ring={ring}: {us:.2f} us", flush=True)
