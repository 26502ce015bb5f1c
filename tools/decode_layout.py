# ruff: noqa: B023, E501, E731, E702, E401, I001  (a profiling script: lambdas bound per loop iteration on purpose)
"""What one decode call costs by K/V layout and whether cache_seqlens is given (transformers'
decode steps give none and hand over (batch, heads, seq, hd) caches through a transpose), against
torch SDPA, at b1 s600 / b1 s4096 / b8 s2048, hd64, 16/8 heads, bf16: wall per call and CUDA-event
time over 500 back-to-back calls, the max error vs float64 SDPA, and a profiler table of the
kernels one call launches. Needs a GPU.

    python tools/decode_layout.py
"""

import time, torch, flashscan
from torch.profiler import profile, ProfilerActivity
from torch.nn.functional import scaled_dot_product_attention as sdpa

torch.manual_seed(0)
bf = torch.bfloat16


def timeit(f, n=500):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    e0.record()
    for _ in range(n):
        f()
    e1.record()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6, e0.elapsed_time(e1) / n * 1e3


for b, s in ((1, 600), (1, 4096), (8, 2048)):
    q = torch.randn(b, 16, 1, 64, device="cuda", dtype=bf)
    kt = torch.randn(b, 8, s, 64, device="cuda", dtype=bf)
    vt = torch.randn_like(kt)
    kc, vc = kt.transpose(1, 2).contiguous(), vt.transpose(1, 2).contiguous()
    seqlens = torch.full((b,), s, device="cuda", dtype=torch.int32)
    qq = q.transpose(1, 2)
    cases = {
        "transposed view, seqlens None (transformers)": lambda: flashscan.flash_attn_with_kvcache(
            qq, kt.transpose(1, 2), vt.transpose(1, 2), softmax_scale=0.125, causal=True
        ),
        "transposed view, seqlens tensor": lambda: flashscan.flash_attn_with_kvcache(
            qq,
            kt.transpose(1, 2),
            vt.transpose(1, 2),
            cache_seqlens=seqlens,
            softmax_scale=0.125,
            causal=True,
        ),
        "contiguous, seqlens None": lambda: flashscan.flash_attn_with_kvcache(
            qq, kc, vc, softmax_scale=0.125, causal=True
        ),
        "contiguous, seqlens tensor": lambda: flashscan.flash_attn_with_kvcache(
            qq, kc, vc, cache_seqlens=seqlens, softmax_scale=0.125, causal=True
        ),
        "flash_attn_func transposed": lambda: flashscan.flash_attn_func(
            qq, kt.transpose(1, 2), vt.transpose(1, 2), softmax_scale=0.125, causal=True
        ),
        "sdpa": lambda: sdpa(q, kt, vt, enable_gqa=True),
    }
    ref = sdpa(q.double(), kt.double(), vt.double(), enable_gqa=True).transpose(1, 2)
    for name, f in cases.items():
        o = f()
        o = o if name != "sdpa" else o.transpose(1, 2)
        err = (o.double() - ref).abs().max().item()
        w, g = timeit(f)
        print(
            f"b{b} s{s} {name:48s} wall {w:7.1f} us  gpu(avg) {g:7.1f} us  err {err:.1e}",
            flush=True,
        )
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            cases["transposed view, seqlens None (transformers)"]()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=50)
    )
