"""selective_state_update b64 d5120 dstate 16 (bf16 x/dt/z/B/C) vs a copy of the same bytes:
20 calls captured in one CUDA graph, median of 20 replays, per call."""

import torch

import flashscan

b, d, n = 64, 5120, 16
dev = "cuda"
state = torch.randn(b, d, n, device=dev, dtype=torch.float32)
x = torch.randn(b, d, device=dev, dtype=torch.bfloat16)
dt = torch.randn(b, d, device=dev, dtype=torch.bfloat16)
A = -torch.rand(d, n, device=dev, dtype=torch.float32)
B = torch.randn(b, n, device=dev, dtype=torch.bfloat16)
C = torch.randn(b, n, device=dev, dtype=torch.bfloat16)
D = torch.randn(d, device=dev, dtype=torch.float32)
z = torch.randn(b, d, device=dev, dtype=torch.bfloat16)
bias = torch.randn(d, device=dev, dtype=torch.float32)


def update() -> None:
    flashscan.selective_state_update(
        state, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True
    )


for _ in range(3):
    update()
torch.cuda.synchronize()
src = torch.empty(b * d * n, device=dev)
dst = torch.empty_like(src)
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
for name, fn in [("copy 21MB", lambda: dst.copy_(src)), ("state_update", update)]:
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g):
            for _ in range(20):
                fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        ev[0].record()
        g.replay()
        ev[1].record()
        torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]) * 1000 / 20)
    ts.sort()
    print(f"{name}: median {ts[10]:.2f} us  min {ts[0]:.2f}")
