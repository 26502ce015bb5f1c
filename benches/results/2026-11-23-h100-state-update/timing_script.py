import torch, flashscan, sys
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
for _ in range(3):
    flashscan.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True)
torch.cuda.synchronize()
# copy floor in the same process
src = torch.empty(b * d * n, device=dev); dst = torch.empty_like(src)
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
for name, fn in [("copy 21MB", lambda: dst.copy_(src)),
                 ("state_update", lambda: flashscan.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True))]:
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g):
            for _ in range(20): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        ev[0].record(); g.replay(); ev[1].record(); torch.cuda.synchronize(); ts.append(ev[0].elapsed_time(ev[1]) * 1000 / 20)
    ts.sort(); print(f"{name}: median {ts[10]:.2f} us  min {ts[0]:.2f}")
