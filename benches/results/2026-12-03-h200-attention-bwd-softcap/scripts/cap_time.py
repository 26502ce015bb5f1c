"""Softcap backward time per shape (one wheel per process; the caller alternates processes)."""

import sys

import torch

import flashscan.torch as fst


def time_ms(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


tag = sys.argv[1]
for d in (64, 128, 256):
    for s_ in (2048, 8192):
        for causal in (False, True):
            b, h = 16384 // s_, 2048 // d
            torch.manual_seed(0)
            q, k, v = (
                torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            dout = torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16)
            out = fst.flash_attn_func(q, k, v, causal=causal, softcap=30.0)

            def bwd(out=out, q=q, k=k, v=v, dout=dout):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            t = min(time_ms(bwd) for _ in range(3))
            g = bwd()
            sums = " ".join(f"{float(x.float().abs().sum()):.6e}" for x in g)
            print(f"{tag} d{d} s{s_} c{int(causal)} {t:.4f} ms {sums}", flush=True)
            del q, k, v, dout, out, g
            torch.cuda.empty_cache()
