"""Small packed-sequence cases on the TMA kernel for compute-sanitizer: out against a float64
torch reference per sequence (max error printed); exits 1 when one is off."""

import sys

import torch

import flashscan

# q lengths, k lengths, h, hk, d, causal, softcap
CASES = [
    ([70, 0, 1, 130], [70, 3, 0, 200], 2, 1, 128, True, 0.0),
    ([200, 65], [200, 65], 3, 3, 64, False, 30.0),
    ([90, 40], [140, 40], 2, 2, 256, True, 0.0),
]
bad = 0
for lq, lk, h, hk, d, causal, cap in CASES:
    torch.manual_seed(d)
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lq), h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lk), hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    flashscan.flash_attn_varlen_func(
        q, k, v, cq, ck, max(lq), max(lk), None, causal, (-1, -1), cap, False, out
    )
    err = 0.0
    for b in range(len(lq)):
        qs = q[cq[b] : cq[b + 1]].double().transpose(0, 1)
        ks = k[ck[b] : ck[b + 1]].double().transpose(0, 1).repeat_interleave(h // hk, 0)
        vs = v[ck[b] : ck[b + 1]].double().transpose(0, 1).repeat_interleave(h // hk, 0)
        o = out[cq[b] : cq[b + 1]].double().transpose(0, 1)
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            err = max(err, o.abs().max().item())
            continue
        s = qs @ ks.transpose(-1, -2) * d**-0.5
        if cap:
            s = cap * torch.tanh(s / cap)
        if causal:
            i = torch.arange(lq[b], device="cuda")[:, None]
            j = torch.arange(lk[b], device="cuda")[None, :]
            s = s.masked_fill(j > i + (lk[b] - lq[b]), float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0)
        err = max(err, (o - p @ vs).abs().max().item())
    ok = err < 2e-2 and not torch.isnan(out).any()
    bad += not ok
    tag = "ok  " if ok else "FAIL"
    print(f"{tag} q{lq} k{lk} h{h}/{hk} d{d} causal={causal} cap={cap}: {err:.2e}")
print("ALL OK" if not bad else f"{bad} FAILED")
sys.exit(1 if bad else 0)
