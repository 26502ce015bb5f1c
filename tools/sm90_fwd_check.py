"""One GPU call's worth of checks for the sm_90a wgmma forward (cuda/flash_fwd_sm90.cu).

Correctness: every shape against a float64 reference (torch, on the GPU), next to the error of
torch SDPA in the same 16-bit dtype (the same-precision baseline); the output is poisoned with NaN
first so an unwritten element fails; LSE is checked too. Timing: ours against SDPA's
FlashAttention-2 and cuDNN backends, CUDA events, median of repeats.

Which forward runs is chosen by FLASHSCAN_SM90_WGMMA (1: the wgmma kernel where it covers the
shape, 0: the mma.sync kernel), read once per process, so run this once per setting:

    FLASHSCAN_SM90_WGMMA=1 python3 tools/sm90_fwd_check.py            # check + time
    FLASHSCAN_SM90_WGMMA=0 python3 tools/sm90_fwd_check.py --time-only --ours-only
    FLASHSCAN_SM90_WGMMA=1 FLASHSCAN_SM90_PIPE=1 python3 tools/sm90_fwd_check.py --ours-only

(the last: the experimental pipelined schedule, FS_SM90_PIPE=1). The wgmma path runs the
warp-specialised TMA kernel (cuda/flash_fwd_sm90_tma.cu; ping-pong unless FLASHSCAN_SM90_PIPE=1
or FLASHSCAN_SM90_PINGPONG=0) unless FLASHSCAN_SM90_TMA=0 keeps the cp.async one; --quick
checks two small odd-size cases only (for compute-sanitizer).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

import flashscan


def reference(q, k, v, scale, left, right):
    """float64 attention with bottom-right aligned windows; rows that see nothing give 0 / -inf."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    rep = h // hk
    q64 = q.double().permute(0, 2, 1, 3)
    k64 = k.double().repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)
    v64 = v.double().repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)
    s = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    rel = j - (i + sk - sq)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        vis &= rel >= -left
    if right >= 0:
        vis &= rel <= right
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    o = torch.matmul(p, v64).permute(0, 2, 1, 3)
    return o, lse


def sdpa_same_precision(q, k, v, scale, left, right):
    """torch SDPA (math backend, 16-bit inputs) as the same-precision baseline."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    rep = h // hk
    qt = q.permute(0, 2, 1, 3)
    kt = k.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)
    vt = v.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    rel = j - (i + sk - sq)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        vis &= rel >= -left
    if right >= 0:
        vis &= rel <= right
    # the math backend, as said: left to choose, torch 2.11 takes cuDNN, whose kernels
    # compute-sanitizer's racecheck / synccheck flag (2026-12-02), hiding ours
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=vis, scale=scale)
    return torch.nan_to_num(o.permute(0, 2, 1, 3), nan=0.0)


CASES = [
    # b, sq, sk, h, hk, d, causal, window
    (2, 256, 256, 4, 4, 128, False, (-1, -1)),
    (2, 333, 333, 4, 4, 128, False, (-1, -1)),
    (1, 1000, 1000, 4, 2, 128, True, (-1, -1)),
    (2, 200, 517, 4, 4, 128, True, (-1, -1)),
    (2, 517, 200, 4, 1, 128, True, (-1, -1)),
    (1, 700, 700, 2, 2, 128, False, (100, 30)),
    (3, 17, 300, 2, 2, 128, False, (-1, -1)),
    (2, 1, 129, 4, 4, 128, True, (-1, -1)),
    (2, 256, 256, 4, 4, 64, False, (-1, -1)),
    (1, 777, 777, 4, 2, 64, True, (-1, -1)),
    (2, 300, 650, 2, 2, 64, False, (64, 0)),
]


QUICK = [CASES[6], CASES[3], CASES[8], CASES[9], CASES[10]]


def check(dtype, cases=CASES) -> bool:
    ok = True
    for b, sq, sk, h, hk, d, causal, window in cases:
        torch.manual_seed(sq * 7 + sk + d)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
        scale = 1.0 / math.sqrt(d)
        left, right = window
        if causal:
            right = 0
        out = torch.full_like(q, float("nan"))
        o, lse = flashscan.flash_attn_func(
            q, k, v, causal=causal, window_size=window, return_lse=True, out=out
        )
        torch.cuda.synchronize()
        ro, rlse = reference(q, k, v, scale, left, right)
        base = sdpa_same_precision(q, k, v, scale, left, right)
        err = (o.double() - ro).abs().max().item()
        base_err = (base.double() - ro).abs().max().item()
        fin = torch.isfinite(rlse)
        lse_err = (lse.double()[fin] - rlse[fin]).abs().max().item() if fin.any() else 0.0
        lse_inf_ok = bool((lse[~fin] == float("-inf")).all())
        nan = bool(torch.isnan(o).any())
        good = (not nan) and err <= 2.0 * base_err + 1e-3 and lse_err < 1e-3 and lse_inf_ok
        ok &= good
        print(
            f"{'ok  ' if good else 'FAIL'} {str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} "
            f"causal={causal} win={window}: max|o-ref|={err:.3e} (sdpa {base_err:.3e}) "
            f"lse {lse_err:.2e} nan={nan}",
            flush=True,
        )
    return ok


def time_ms(fn, reps=30, warmup=5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def bench(ours_only: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mode = os.environ.get("FLASHSCAN_SM90_WGMMA", "default")
    tma, pipe = (os.environ.get(f"FLASHSCAN_SM90_{n}", "0") for n in ("TMA", "PIPE"))
    mode += f", TMA={tma}, PIPE={pipe}"
    shapes = [
        (4, 4096, 16, 128, False),
        (4, 4096, 16, 128, True),
        (4, 4096, 32, 64, False),
        (4, 4096, 32, 64, True),
        (16, 1024, 16, 128, False),
        (1, 16384, 16, 128, True),
    ]
    print(f"timing (TFLOP/s, median of 30; FLASHSCAN_SM90_WGMMA={mode})")
    for dtype in (torch.bfloat16, torch.float16):
        for b, s, h, d, causal in shapes:
            q = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
            k = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
            v = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
            out = torch.empty_like(q)
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            row = [f"{str(dtype)[6:]:8s} b{b} s{s} h{h} d{d} causal={int(causal)}"]
            ms = time_ms(
                lambda q=q, k=k, v=v, c=causal, o=out: flashscan.flash_attn_func(
                    q, k, v, causal=c, out=o
                )
            )
            row.append(f"ours {flops / ms / 1e9:6.1f}")
            if not ours_only:
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                backends = (
                    ("fa2", SDPBackend.FLASH_ATTENTION),
                    ("cudnn", SDPBackend.CUDNN_ATTENTION),
                )
                for name, be in backends:
                    try:
                        with sdpa_kernel([be]):
                            f = lambda q=qt, k=kt, v=vt, c=causal: (  # noqa: E731
                                torch.nn.functional.scaled_dot_product_attention(
                                    q, k, v, is_causal=c
                                )
                            )
                            ms = time_ms(f)
                        row.append(f"{name} {flops / ms / 1e9:6.1f}")
                    except Exception as exc:  # a backend that refuses the shape
                        row.append(f"{name} n/a ({type(exc).__name__})")
            print("  ".join(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--ours-only", action="store_true")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    env = {
        k: os.environ.get(k)
        for k in ("FLASHSCAN_SM90_WGMMA", "FLASHSCAN_SM90_TMA", "FLASHSCAN_SM90_PIPE")
    }
    print(torch.cuda.get_device_name(), env)
    ok = True
    if a.quick:
        ok = check(torch.bfloat16, QUICK)
        print("QUICK CORRECTNESS", "PASS" if ok else "FAIL", flush=True)
        return 0 if ok else 1
    if not a.time_only:
        ok = check(torch.bfloat16)
        ok &= check(torch.float16)
        print("CORRECTNESS", "PASS" if ok else "FAIL", flush=True)
    if not a.check_only:
        bench(a.ours_only)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
