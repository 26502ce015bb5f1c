"""Dense forward timings (bf16, batch x seqlen 16k, nheads = 2048 // hd) of whichever wheel is on
the path: one JSON line a shape, for A/B runs of two wheels in alternating processes."""

import json
import statistics
import sys

import torch

import flashscan

for shape in sys.argv[1].split(","):
    d, s, c = (int(x) for x in shape.split(":"))
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    flops = 4.0 * b * h * s * s * d * (0.5 if c else 1.0)
    for _ in range(3):
        flashscan.flash_attn_func(q, k, v, causal=bool(c), out=out)
    ts = []
    for _ in range(15):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(8):
            flashscan.flash_attn_func(q, k, v, causal=bool(c), out=out)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 8)
    print(json.dumps({"shape": shape, "tflops": round(flops / statistics.median(ts) / 1e9, 1)}))
