#!/usr/bin/env python3
"""Per-kernel view of the causal conv1d at the Mamba-2 bench shape (b8 L2048 d5376 bf16, width 4,
bias, SiLU), channel-last and channel-first: forward and forward + backward (torch autograd)
medians (triton.testing.do_bench), and the kernels one forward + backward launches with their
times and their sum (torch.profiler, mean of 5). For A/B of kernel changes: run it once per
installed wheel. With --peer, causal-conv1d's `causal_conv1d_fn` (built from a source checkout by
flashscan.bench.conv1d_src) is profiled the same way on the same inputs: a GPU-time comparison
that the host's own speed does not move.

    python tools/conv1d_profile.py TAG [--peer SRC BUILD_DIR] [--shape BATCH DIM SEQLEN]

--shape replaces the bench shape (e.g. the real-time 32 640 60).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from triton.testing import do_bench

import flashscan
import flashscan.torch as fst

B, D, L = 8, 5376, 2048


def profile(tag: str, layout: str, fn_impl: Any = None) -> str:
    shape = (B, L, D) if layout == "cl" else (B, D, L)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    if layout == "cl":
        x, dout = x.transpose(1, 2), dout.transpose(1, 2)
    x.requires_grad_()
    w = (torch.randn(D, 4, device="cuda", dtype=torch.bfloat16) / 4).requires_grad_()
    b = torch.randn(D, device="cuda", dtype=torch.bfloat16).requires_grad_()

    fwd_fn = fn_impl or flashscan.causal_conv1d_fn
    step_fn = fn_impl or fst.causal_conv1d_fn

    def fwd() -> object:
        return fwd_fn(x, w, b, activation="silu")

    def step() -> object:
        out = step_fn(x, w, b, activation="silu")
        return torch.autograd.grad(out, (x, w, b), dout)

    tf = do_bench(fwd, warmup=25, rep=200, return_mode="median") * 1e3
    ts = do_bench(step, warmup=25, rep=200, return_mode="median") * 1e3
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels = {
        e.key[:40]: e.device_time_total / 5
        for e in prof.key_averages()
        if e.device_type == torch.autograd.DeviceType.CUDA
    }
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:5]
    gbps = 2 * x.numel() * x.element_size() / tf / 1e3
    split = ", ".join(f"{k} {v:.1f}" for k, v in top)
    gpu = sum(kernels.values())
    return (
        f"{tag} {layout}: fwd {tf:.1f} us ({gbps:.0f} GB/s), fwd+bwd {ts:.1f} us, "
        f"GPU time of fwd+bwd {gpu:.1f} us | {split}"
    )


def main() -> int:
    global B, D, L
    args = sys.argv[1:]
    if "--shape" in args:
        i = args.index("--shape")
        B, D, L = (int(v) for v in args[i + 1 : i + 4])
        del args[i : i + 4]
    peer = None
    if "--peer" in args:
        i = args.index("--peer")
        src, build = args[i + 1], args[i + 2]
        del args[i : i + 3]
        from flashscan.bench import conv1d_src

        info = conv1d_src.load(src, build, print)
        if info["module"] is None:
            print(f"causal-conv1d not loaded: {info['error']}")
            return 1
        peer = (f"causal-conv1d {info['src_commit']}", info["module"].causal_conv1d_fn)
    tag = args[0] if args else "flashscan"
    for layout in ("cl", "cf"):
        print(profile(tag, layout), flush=True)
        if peer is not None:
            print(profile(peer[0], layout, peer[1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
