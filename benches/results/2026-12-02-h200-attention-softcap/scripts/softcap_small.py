"""Small softcap cases on the TMA kernel for compute-sanitizer: out against a float64 torch
reference (max error printed); exits 1 when one is off."""

import sys

import torch

import flashscan

CASES = [
    (1, 150, 260, 2, 1, 128, True, 30.0),
    (2, 77, 77, 2, 2, 256, False, 1.0),
    (1, 200, 200, 3, 3, 64, True, 50.0),
]
bad = 0
for b, sq, sk, h, hk, d, causal, cap in CASES:
    torch.manual_seed(d)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    o = flashscan.flash_attn_func(q, k, v, causal=causal, softcap=cap, out=out)
    qq, kk, vv = (x.double().transpose(1, 2) for x in (q, k, v))
    kk, vv = kk.repeat_interleave(h // hk, 1), vv.repeat_interleave(h // hk, 1)
    s = qq @ kk.transpose(-1, -2) * d**-0.5
    s = cap * torch.tanh(s / cap)
    if causal:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    ref = (torch.softmax(s, -1) @ vv).transpose(1, 2)
    err = (o.double() - ref).abs().max().item()
    ok = err < 2e-2 and not torch.isnan(o).any()
    bad += not ok
    tag = "ok  " if ok else "FAIL"
    print(f"{tag} b{b} q{sq} k{sk} h{h}/{hk} d{d} causal={causal} cap={cap}: {err:.2e}")
print("ALL OK" if not bad else f"{bad} FAILED")
sys.exit(1 if bad else 0)
