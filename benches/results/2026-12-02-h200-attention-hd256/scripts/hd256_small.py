"""Small head-dim-256 (and padded 136-248) cases on the TMA kernel for compute-sanitizer: out
against a float64 torch reference (max error printed); exits 1 when one is off."""

import sys

import torch

import flashscan

CASES = [
    (1, 150, 260, 2, 1, 256, True),
    (2, 77, 77, 2, 2, 256, False),
    (1, 130, 200, 2, 2, 192, True),
    (1, 70, 70, 2, 2, 136, False),
]
bad = 0
for b, sq, sk, h, hk, d, causal in CASES:
    torch.manual_seed(d)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    o, lse = flashscan.flash_attn_func(q, k, v, causal=causal, return_lse=True, out=out)
    qq, kk, vv = (x.double().transpose(1, 2) for x in (q, k, v))
    kk, vv = kk.repeat_interleave(h // hk, 1), vv.repeat_interleave(h // hk, 1)
    s = qq @ kk.transpose(-1, -2) * d**-0.5
    if causal:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    ref = (torch.softmax(s, -1) @ vv).transpose(1, 2)
    err = (o.double() - ref).abs().max().item()
    ok = err < 2e-2 and not torch.isnan(o).any()
    bad += not ok
    print(f"{'ok  ' if ok else 'FAIL'} b{b} q{sq} k{sk} h{h}/{hk} d{d} causal={causal}: {err:.2e}")
print("ALL OK" if not bad else f"{bad} FAILED")
sys.exit(1 if bad else 0)
