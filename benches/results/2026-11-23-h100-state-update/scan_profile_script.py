"""selective_scan_fn at the real-time (rt, rt1) and a large (big) shape, bf16, D, z, delta_bias,
softplus, varying B/C: `python scan_profile_script.py SHAPE [time]` (with `time`: 20 calls in a
CUDA graph, median of 20 replays per call; without: three calls, for ncu)."""

import sys

import torch

import flashscan

shape = sys.argv[1]
b, d, L = {"rt": (32, 512, 60), "rt1": (1, 512, 60), "big": (8, 2048, 2048)}[shape]
n = 16
dev, dt_ = "cuda", torch.bfloat16
u = torch.randn(b, d, L, device=dev, dtype=dt_)
delta = torch.randn(b, d, L, device=dev, dtype=dt_) * 0.5
A = -torch.rand(d, n, device=dev) - 0.5
B = torch.randn(b, 1, n, L, device=dev, dtype=dt_)
C = torch.randn(b, 1, n, L, device=dev, dtype=dt_)
D = torch.randn(d, device=dev)
z = torch.randn(b, d, L, device=dev, dtype=dt_)
bias = torch.randn(d, device=dev) * 0.1


def scan() -> None:
    flashscan.selective_scan_fn(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True)


for _ in range(3):
    scan()
torch.cuda.synchronize()
if len(sys.argv) > 2:
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        scan()
        with torch.cuda.graph(g):
            for _ in range(20):
                scan()
    torch.cuda.synchronize()
    e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ts = []
    for _ in range(20):
        e[0].record()
        g.replay()
        e[1].record()
        torch.cuda.synchronize()
        ts.append(e[0].elapsed_time(e[1]) * 50)
    ts.sort()
    print(f"{shape}: graph median {ts[10]:.2f} us/call")
