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


if __name__ == "__main__":
    assert flashscan.available(), flashscan.info()
    n = attention_cases() + scan_cases()
    torch.cuda.synchronize()
    print("sanitize cases done, wrong results:", n)
    sys.exit(1 if n else 0)
