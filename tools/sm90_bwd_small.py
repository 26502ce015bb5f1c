#!/usr/bin/env python3
"""Small odd backward problems for a first run of the wgmma backward (FLASHSCAN_SM90_BWD=1) and
for compute-sanitizer: hd64 / hd128 / hd256, fp16 / bf16, causal, a window, softcap, GQA,
seqlen_q != seqlen_k, tails that are not multiples of the tiles. Each is compared with float64
autograd (max error relative to the largest reference gradient, NaN-poisoned output buffers);
prints one line per case and exits 1 if any is off. Needs torch and a GPU; the switch is read
from the environment. `--deterministic`: every call with deterministic=True (the wgmma kernel's
walk of launches over accumulator slices), plus cases with more (batch, kv head) pairs than
slices so that the walk takes several launches."""

from __future__ import annotations

import os
import sys

import torch

import flashscan

CASES = [
    # b, sq, sk, h, hk, d, dtype, causal, window, softcap
    (1, 77, 291, 4, 2, 128, torch.bfloat16, True, (-1, -1), 0.0),
    (2, 130, 130, 2, 2, 128, torch.float16, False, (-1, -1), 0.0),
    (1, 200, 120, 2, 1, 64, torch.bfloat16, True, (-1, -1), 0.0),
    (1, 150, 260, 2, 2, 64, torch.float16, False, (40, 20), 0.0),
    (1, 77, 291, 4, 2, 256, torch.bfloat16, True, (-1, -1), 0.0),
    (2, 130, 70, 2, 2, 256, torch.float16, False, (-1, -1), 0.0),
    (1, 100, 140, 2, 1, 256, torch.bfloat16, False, (30, 10), 0.0),
    (1, 77, 291, 4, 2, 256, torch.bfloat16, True, (-1, -1), 50.0),
    (1, 150, 130, 2, 1, 128, torch.float16, False, (40, 20), 10.0),
    (2, 200, 120, 2, 2, 64, torch.bfloat16, True, (-1, -1), 5.0),
]


# deterministic runs only: 8 x 16 kv heads on 132 SMs -> one slice, a launch per kv block
DET_CASES = [
    (8, 130, 291, 16, 16, 64, torch.bfloat16, True, (-1, -1), 0.0),
    (8, 100, 150, 16, 16, 256, torch.float16, False, (-1, -1), 20.0),
]

DET = "--deterministic" in sys.argv

# packed (varlen) calls: q lengths, k lengths, h, hk, d, dtype, causal, window, softcap; each
# sequence's gradients against float64 on that sequence alone (empty query sequences included)
VARLEN_CASES = [
    ([70, 0, 1, 130], [90, 5, 3, 130], 4, 2, 128, torch.bfloat16, True, (-1, -1), 0.0),
    ([33, 150], [200, 64], 2, 1, 64, torch.float16, False, (30, 10), 10.0),
    ([65, 1, 100], [65, 77, 100], 2, 2, 256, torch.bfloat16, True, (-1, -1), 50.0),
]


def reference(q, k, v, dout, causal, window, softcap=0.0):  # noqa: ANN001, ANN201
    g = q.shape[2] // k.shape[2]
    qq, kk, vv = (t.double().transpose(1, 2).requires_grad_() for t in (q, k, v))
    ke, ve = kk.repeat_interleave(g, 1), vv.repeat_interleave(g, 1)
    s = qq @ ke.transpose(-1, -2) * q.shape[-1] ** -0.5
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    if causal:
        right = 0
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    # a query that sees no key (sq > sk, causal) gets P = 0 without NaN in the graph
    seen = vis.any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~vis & seen, float("-inf")), -1) * seen
    out = p @ ve
    return torch.autograd.grad(out, (qq, kk, vv), dout.double().transpose(1, 2))


def main() -> int:
    print(
        f"FLASHSCAN_SM90_BWD={os.environ.get('FLASHSCAN_SM90_BWD')}, deterministic={DET},"
        f" {torch.cuda.get_device_name()}"
    )
    bad = 0
    for b, sq, sk, h, hk, d, dt, causal, window, cap in CASES + (DET_CASES if DET else []):
        torch.manual_seed(sq + sk + d)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dt)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=dt) for _ in range(2))
        dout = torch.randn_like(q)
        out, lse = flashscan.flash_attn_func(
            q, k, v, causal=causal, window_size=window, softcap=cap, return_lse=True
        )
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        stream = torch.cuda.current_stream().cuda_stream
        right = 0 if causal else window[1]
        flashscan._native.flash_attn_bwd(
            dout, q, k, v, out, lse, *grads, d**-0.5, window[0], right, cap, DET, stream
        )
        torch.cuda.synchronize()
        ref = reference(q, k, v, dout, causal, window, cap)
        errs = []
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
            r = r.transpose(1, 2)
            err = float((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-6))
            ok = bool(torch.isfinite(g).all()) and err < 2e-2
            bad += not ok
            errs.append(f"{name} {err:.1e}{'' if ok else ' FAIL'}")
        print(
            f"b{b} q{sq} k{sk} h{h}/{hk} d{d} {dt} causal={causal} window={window} cap={cap}: "
            + ", ".join(errs)
        )
    bad += varlen_cases()
    print("ALL OK" if bad == 0 else f"{bad} gradient(s) off")
    return 1 if bad else 0


def varlen_cases() -> int:
    import flashscan.torch as fst

    bad = 0
    for lq, lk, h, hk, d, dt, causal, window, cap in VARLEN_CASES:
        torch.manual_seed(sum(lq) + d)
        cq, ck = ([0] + torch.tensor(x).cumsum(0).tolist() for x in (lq, lk))
        q = torch.randn(cq[-1], h, d, device="cuda", dtype=dt, requires_grad=True)
        k, v = (
            torch.randn(ck[-1], hk, d, device="cuda", dtype=dt, requires_grad=True)
            for _ in range(2)
        )
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cq, ck))
        out = fst.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lq), max(lk), None, causal, window, cap, deterministic=DET
        )
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        errs = []
        for i in range(len(lq)):
            qs, ds = (t[None, cq[i] : cq[i + 1]].detach() for t in (q, dout))
            ks, vs = (t[None, ck[i] : ck[i + 1]].detach() for t in (k, v))
            if qs.shape[1] == 0:  # no queries: dk = dv = 0 for the sequence's keys
                ref = [torch.zeros(1, h, 0, d), torch.zeros(1, hk, lk[i], d)]
                ref = [x.double().cuda() for x in (ref[0], ref[1], ref[1])]
            else:
                ref = reference(qs, ks, vs, ds, causal, window, cap)
            sl = [slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1]), slice(ck[i], ck[i + 1])]
            for name, g, r, rows in zip(("dq", "dk", "dv"), grads, ref, sl):
                g, r = g[rows], r[0].transpose(0, 1)
                if g.numel() == 0:
                    continue
                scale = float(r.abs().max().clamp_min(1e-6)) if r.numel() else 1.0
                err = float((g.double() - r).abs().max() / scale)
                ok = bool(torch.isfinite(g).all()) and (err < 2e-2 or float(r.abs().max()) == 0)
                if float(r.abs().max()) == 0:
                    ok = ok and float(g.abs().max()) == 0
                bad += not ok
                errs.append(f"s{i} {name} {err:.1e}{'' if ok else ' FAIL'}")
        print(
            f"varlen q{lq} k{lk} h{h}/{hk} d{d} {dt} causal={causal} window={window} cap={cap}: "
            + ", ".join(errs)
        )
    return bad


if __name__ == "__main__":
    sys.exit(main())
