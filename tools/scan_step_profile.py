# ruff: noqa: B023, E501, E731, E702, E401, I001  (a profiling script: lambdas bound per loop iteration on purpose)
"""A scan training step at the real-time shapes (b32 / b1, d512 L60 n16 bf16) through
flashscan.torch + autograd.grad: wall per call, then torch.profiler's table of where the GPU and
host time go (kernels, allocations, copies). Needs a GPU.

    python tools/scan_step_profile.py
"""

import time, torch
import flashscan.torch as fst
from torch.profiler import profile, ProfilerActivity

ops = torch.ops.flashscan
bf = torch.bfloat16
for b in (32, 1):
    d, L, n = 512, 60, 16
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
    step = lambda: torch.autograd.grad(
        fst.selective_scan_fn(*leaves, delta_softplus=True), leaves, dout
    )
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(300):
        step()
    torch.cuda.synchronize()
    print(f"b{b} step wall {(time.perf_counter() - t) / 300 * 1e6:.1f} us")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
    )
