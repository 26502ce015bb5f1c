"""Where the time of a training step goes at the real-time shapes (device dev tool):
per-call wall times of each layer, then a cProfile of the scan and attention steps."""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

import flashscan
import flashscan.torch as fst


def wall(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


b, d, L, n = 32, 512, 60, 16
bf = torch.bfloat16
args = [
    torch.randn(b, d, L, device="cuda", dtype=bf),
    (torch.rand(b, d, L, device="cuda") - 2).to(bf),
    -torch.rand(d, n, device="cuda"),
    torch.randn(b, n, L, device="cuda", dtype=bf),
    torch.randn(b, n, L, device="cuda", dtype=bf),
    torch.randn(d, device="cuda"),
    torch.randn(b, d, L, device="cuda", dtype=bf),
    torch.rand(d, device="cuda"),
]
leaves = [t.clone().requires_grad_() for t in args]
dout = torch.randn_like(args[0])
ops = torch.ops.flashscan
empty = args[0].new_empty((0,), dtype=torch.float32)


def scan_step():
    y = fst.selective_scan_fn(*leaves, delta_softplus=True)
    return torch.autograd.grad(y, leaves, dout)


print(
    f"scan fwd (API, no grad)      {wall(lambda: flashscan.selective_scan_fn(*args, delta_softplus=True)):8.1f} us"
)
print(
    f"scan fwd op (saving)         {wall(lambda: ops.selective_scan_fwd(*args, None, True, True)):8.1f} us"
)
print(
    f"scan bwd op                  {wall(lambda: ops.selective_scan_bwd(dout, None, *args, None, empty, True)):8.1f} us"
)
print(f"scan fwd+bwd step (autograd) {wall(scan_step):8.1f} us")

q = torch.randn(32, 60, 8, 64, device="cuda", dtype=bf)
k, v = torch.randn_like(q), torch.randn_like(q)
ql = [t.clone().requires_grad_() for t in (q, k, v)]
do = torch.randn_like(q)
out, lse = ops.flash_attn_fwd(q, k, v, 0.125, -1, 0, 0.0, False)


def attn_step():
    o = fst.flash_attn_func(*ql, causal=True)
    return torch.autograd.grad(o, ql, do)


print(
    f"attn fwd (API, no grad)      {wall(lambda: flashscan.flash_attn_func(q, k, v, causal=True)):8.1f} us"
)
print(
    f"attn fwd op                  {wall(lambda: ops.flash_attn_fwd(q, k, v, 0.125, -1, 0, 0.0, False)):8.1f} us"
)
print(
    f"attn bwd op                  {wall(lambda: ops.flash_attn_bwd(do, q, k, v, out, lse, 0.125, -1, 0, 0.0, False)):8.1f} us"
)
print(f"attn fwd+bwd step (autograd) {wall(attn_step):8.1f} us")

for name, fn in (("scan step", scan_step), ("attn step", attn_step)):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    print(f"==== cProfile: {name} x200")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
