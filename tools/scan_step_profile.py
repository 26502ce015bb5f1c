# ruff: noqa: B023, E501, E731, E702, E401, I001  (a profiling script: lambdas bound per loop iteration on purpose)
"""A scan training step at the real-time shapes (b32 / b1, d512 L60 n16 bf16) through
flashscan.torch + autograd.grad: wall per call, then torch.profiler's table of where the GPU and
host time go (kernels, allocations, copies). Needs a GPU.

    python tools/scan_step_profile.py
"""

import time, torch
import flashscan.torch as fst
from flashscan.bench.training import realtime_scan_args
from torch.profiler import profile, ProfilerActivity

ops = torch.ops.flashscan
bf = torch.bfloat16
for b in (32, 1):
    args = realtime_scan_args(torch, b)
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
