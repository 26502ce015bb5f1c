"""Deterministic attention backward on the H200, call 2: the wgmma kernel's walk with chains of
CTAs sharing a slice (the default) against the same walk with a slice per CTA
(FLASHSCAN_SM90_BWD_CHAINS=0, call 1's form), the wgmma kernel's plain backward
(deterministic=False) and SDPA's cuDNN / FlashAttention-2 backwards (neither deterministic),
interleaved in one process, 3 rounds, best of each. bf16,
batch x seqlen = 16k, nheads x hd = 2048; plus the real-time shape. Backward alone (autograd.grad
of a saved forward), CUDA-event time of 10 calls."""

import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan.torch as fst

HEADER = (
    "| hd | seqlen | batch | causal | det chains ms | det slices ms | plain wgmma ms | cuDNN ms"
    " | FA2 ms | det chains TFLOP/s | chains / slices | det / plain | det / cuDNN | same bits |"
)


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


def one_shape(d: int, s_: int, b: int, h: int, causal: bool) -> None:
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dout = torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16)
    flops = 2.5 * 4 * b * h * s_ * s_ * d / (2 if causal else 1)
    out_det = fst.flash_attn_func(q, k, v, causal=causal, deterministic=True)
    out_plain = fst.flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    dt_ = dout.transpose(1, 2)
    sd = {}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(be):
                sd[name] = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        except Exception as exc:  # noqa: BLE001
            print(f"{name} d{d} s{s_}: {type(exc).__name__}", file=sys.stderr)

    def bwd(o, leaves, g):
        return torch.autograd.grad(o, leaves, g, retain_graph=True)

    configs = {
        "det": ("1", lambda: bwd(out_det, (q, k, v), dout)),
        "det_mma": ("0", lambda: bwd(out_det, (q, k, v), dout)),  # (CHAINS=0: the slices)
        "plain": ("1", lambda: bwd(out_plain, (q, k, v), dout)),
    }
    for name, o in sd.items():
        configs[name] = ("1", lambda o=o: bwd(o, (qt, kt, vt), dt_))
    res = {n: [] for n in configs}
    first = None
    same = True
    for _round in range(3):
        for n, (sw, fn) in configs.items():
            os.environ["FLASHSCAN_SM90_BWD_CHAINS"] = sw
            res[n].append(time_ms(fn))
            if n == "det":
                g = fn()
                if first is None:
                    first = g
                else:
                    same = same and all(torch.equal(a, c) for a, c in zip(first, g))
            if n == "det_mma":  # the slices' sum in another order: equal to rounding, not bits
                g = fn()
                rel = max(float((a - c).abs().max() / c.abs().max()) for a, c in zip(g, first))
                assert rel < 1e-2, f"chains vs slices differ by {rel}"
    os.environ["FLASHSCAN_SM90_BWD_CHAINS"] = "1"
    t = {n: min(v) for n, v in res.items()}
    nan = float("nan")
    a = t["det"]
    print(
        f"| {d} | {s_} | {b} | {int(causal)} | {a:.3f} | {t['det_mma']:.3f} | {t['plain']:.3f}"
        f" | {t.get('cudnn', nan):.3f} | {t.get('fa2', nan):.3f} | {flops / a / 1e9:.0f}"
        f" | {t['det_mma'] / a:.2f}x | {t['plain'] / a:.2f} | {t.get('cudnn', nan) / a:.2f}"
        f" | {'yes' if same else 'NO'} |",
        flush=True,
    )


def main() -> None:
    print(HEADER)
    print("|---" * 14 + "|")
    for d in (128, 64, 256):
        for s_ in (1024, 4096, 16384):
            for causal in (False, True):
                one_shape(d, s_, 16384 // s_, 2048 // d, causal)
                torch.cuda.empty_cache()
    for causal in (False, True):  # the real-time agent's shape
        one_shape(64, 60, 32, 8, causal)


if __name__ == "__main__":
    main()
