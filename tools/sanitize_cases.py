"""Small shapes of every kernel variant, for compute-sanitizer (memcheck, racecheck):
`compute-sanitizer --tool memcheck python3 tools/sanitize_cases.py`. Exits non-zero on a
wrong result too, so a silent race that corrupts output is caught as well."""

from __future__ import annotations

import itertools
import sys

import torch

import flashscan


def attention_cases() -> int:
    bad = 0
    dtypes = [torch.float16, torch.bfloat16, torch.float32]
    for hd, dtype in itertools.product([32, 40, 64, 96, 128, 192, 256], dtypes):
        for causal, window, softcap in [
            (False, (-1, -1), 0.0),
            (True, (-1, -1), 0.0),
            (False, (9, 3), 5.0),
        ]:
            q = torch.randn(1, 65, 2, hd, device="cuda", dtype=dtype)
            k = torch.randn(1, 33, 1, hd, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            out = flashscan.flash_attn_func(
                q, k, v, causal=causal, window_size=window, softcap=softcap
            )
            ref = flashscan.reference.flash_attn_func(
                q.float().cpu().numpy(),
                k.float().cpu().numpy(),
                v.float().cpu().numpy(),
                causal=causal,
                window_size=window,
                softcap=softcap,
            )
            err = (out.float().cpu() - torch.from_numpy(ref)).abs().max().item()
            if not err < 0.05:
                print(f"attention hd={hd} {dtype} causal={causal} window={window}: err {err}")
                bad += 1
    return bad


def scan_cases() -> int:
    bad = 0
    for dtype, dstate, varying in itertools.product(
        [torch.float32, torch.bfloat16], [1, 16, 64], [False, True]
    ):
        b, d, L = 2, 24, 67
        u = torch.randn(b, d, L, device="cuda", dtype=dtype)
        delta = torch.rand(b, d, L, device="cuda", dtype=dtype)
        A = -torch.rand(d, dstate, device="cuda")
        if varying:
            B = torch.randn(b, 2, dstate, L, device="cuda", dtype=dtype)
        else:
            B = torch.randn(d, dstate, device="cuda")
        C = torch.randn_like(B)
        D = torch.randn(d, device="cuda")
        z = torch.randn_like(u)
        out, last = flashscan.selective_scan_fn(
            u, delta, A, B, C, D=D, z=z, delta_softplus=True, return_last_state=True
        )
        ref, ref_last = flashscan.reference.selective_scan_fn(
            *(t.float().cpu().numpy() for t in (u, delta, A, B, C)),
            D=D.cpu().numpy(),
            z=z.float().cpu().numpy(),
            delta_softplus=True,
            return_last_state=True,
        )
        err = (out.float().cpu() - torch.from_numpy(ref).float()).abs().max().item()
        scale = max(1.0, float(abs(ref).max()))
        if not err / scale < 0.05:
            print(f"scan {dtype} dstate={dstate} varying={varying}: err {err}")
            bad += 1
        state = torch.randn(b, d, dstate, device="cuda")
        x = torch.randn(b, d, device="cuda", dtype=dtype)
        dt = torch.rand(b, d, device="cuda", dtype=dtype)
        Bs, Cs = (
            torch.randn(b, dstate, device="cuda", dtype=dtype),
            torch.randn(b, dstate, device="cuda", dtype=dtype),
        )
        flashscan.selective_state_update(state, x, dt, A, Bs, Cs, D=D, z=x, dt_softplus=True)
    return bad


def backward_cases() -> int:
    """Small backward calls (attention incl. deterministic mode; the scan with and without
    saved states), checked against the NumPy reference backward."""
    import flashscan.torch as fst

    bad = 0
    for hd, dtype, causal, det in [
        (64, torch.bfloat16, True, False),
        (72, torch.float16, False, True),
        (40, torch.float32, False, False),
        (256, torch.bfloat16, True, True),
    ]:
        q = torch.randn(1, 70, 4, hd, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(1, 45, 2, hd, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(1, 45, 2, hd, device="cuda", dtype=dtype, requires_grad=True)
        dout = torch.randn_like(q)
        out, lse = fst.flash_attn_func(q, k, v, causal=causal, return_lse=True, deterministic=det)
        got = torch.autograd.grad(out, (q, k, v), dout)
        host = [t.detach().float().cpu().numpy() for t in (dout, q, k, v, out, lse)]
        ref = flashscan.reference_bwd.flash_attn_bwd(*host, causal=causal)
        for g, r in zip(got, ref):
            err = (g.float().cpu() - torch.from_numpy(r)).abs().max().item()
            if not err < 0.05 * max(1.0, float(abs(r).max())):
                print(f"attention bwd hd={hd} {dtype} causal={causal} det={det}: err {err}")
                bad += 1
    for dtype, L in [(torch.bfloat16, 300), (torch.float32, 67)]:
        b, d, n = 2, 24, 16
        args = [
            torch.randn(b, d, L, device="cuda", dtype=dtype),
            torch.rand(b, d, L, device="cuda", dtype=dtype),
            -torch.rand(d, n, device="cuda"),
            torch.randn(b, n, L, device="cuda", dtype=dtype),
            torch.randn(b, n, L, device="cuda", dtype=dtype),
            torch.randn(d, device="cuda"),
            torch.randn(b, d, L, device="cuda", dtype=dtype),
            torch.rand(d, device="cuda"),
        ]
        leaves = [t.requires_grad_() for t in args]
        y = fst.selective_scan_fn(*leaves, delta_softplus=True)
        dout = torch.randn_like(y)
        got = torch.autograd.grad(y, leaves, dout)
        host = [t.detach().float().cpu().numpy() for t in args]
        ref = flashscan.reference_bwd.selective_scan_bwd(
            dout.float().cpu().numpy(),
            *host[:5],
            D=host[5],
            z=host[6],
            delta_bias=host[7],
            delta_softplus=True,
        )
        for g, r in zip(got, ref):
            err = (g.float().cpu() - torch.from_numpy(r)).abs().max().item()
            if not err < 0.05 * max(1.0, float(abs(r).max())):
                print(f"scan bwd {dtype} L={L}: err {err}")
                bad += 1
    return bad


if __name__ == "__main__":
    assert flashscan.available(), flashscan.info()
    n = attention_cases() + scan_cases() + backward_cases()
    torch.cuda.synchronize()
    print("sanitize cases done, wrong results:", n)
    sys.exit(1 if n else 0)
