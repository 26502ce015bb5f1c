"""Softcap backward on the H200: flashscan's wgmma backward (FLASHSCAN_SM90_BWD=1, the default) vs
its mma.sync backward (=0), alternating in one process, and torch's flex_attention (compiled, the
softcap as a score_mod) as the peer: SDPA's FA2 / cuDNN backends have no softcap. bf16,
batch x seqlen = 16k, nheads x hd = 2048, softcap 30 (Gemma-2's attention cap).
(The script as run, reformatted for the linter: one function per shape, same steps.)"""

import os
import sys

import torch

import flashscan.torch as fst

CAP = 30.0
HEADER = (
    "| hd | seqlen | causal | wgmma bwd ms | mma.sync bwd ms | wgmma bwd TFLOP/s"
    " | mma.sync bwd TFLOP/s | wgmma / mma.sync | wgmma fwd+bwd TFLOP/s | flex fwd+bwd TFLOP/s"
    " | ours / flex | max rel diff | wgmma bwd ms, no softcap |"
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


flex = None
try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.config.recompile_limit = 256  # one compile per shape: 12 shapes x fwd / bwd
    torch._dynamo.config.cache_size_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
except Exception as exc:  # noqa: BLE001
    print("flex_attention unavailable:", exc)


def softcap_mod(score, b, h, qi, ki):
    return CAP * torch.tanh(score / CAP)


def causal_mask(b, h, qi, ki):
    return qi >= ki


def one_shape(d: int, s_: int, causal: bool) -> None:
    b, h = 16384 // s_, 2048 // d
    q, k, v = (
        torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dout = torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16)
    flops = 4 * b * h * s_ * s_ * d / (2 if causal else 1)
    out = fst.flash_attn_func(q, k, v, causal=causal, softcap=CAP)

    def bwd(o):
        return torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)

    res, grads = {"1": [], "0": []}, {}
    for _round in range(3):
        for val in ("1", "0"):
            os.environ["FLASHSCAN_SM90_BWD"] = val
            grads.setdefault(val, [x.float() for x in bwd(out)])
            res[val].append(time_ms(lambda: bwd(out)))
    os.environ["FLASHSCAN_SM90_BWD"] = "1"
    out0 = fst.flash_attn_func(q, k, v, causal=causal)  # the same call without softcap
    t_nocap = min(time_ms(lambda: bwd(out0)) for _ in range(3))
    diff = max(float((x - r).abs().max() / r.abs().max()) for x, r in zip(grads["1"], grads["0"]))

    def ours_step():
        o = fst.flash_attn_func(q, k, v, causal=causal, softcap=CAP)
        torch.autograd.grad(o, (q, k, v), dout)

    t_ours = min(time_ms(ours_step) for _ in range(2))
    t_flex = float("nan")
    if flex is not None:
        try:
            qt, kt, vt = (
                x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)
            )
            dt = dout.transpose(1, 2).contiguous()
            bm = create_block_mask(causal_mask, None, None, s_, s_) if causal else None

            def flex_step():
                o = flex(qt, kt, vt, score_mod=softcap_mod, block_mask=bm)
                torch.autograd.grad(o, (qt, kt, vt), dt)

            t_flex = min(time_ms(flex_step) for _ in range(2))
        except Exception as exc:  # noqa: BLE001
            print(f"flex d{d} s{s_}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    a, m = min(res["1"]), min(res["0"])

    def tf(t, mult):
        return mult * flops / t / 1e9

    print(
        f"| {d} | {s_} | {int(causal)} | {a:.3f} | {m:.3f} | {tf(a, 2.5):.0f} | {tf(m, 2.5):.0f}"
        f" | {m / a:.2f}x | {tf(t_ours, 3.5):.0f} | {tf(t_flex, 3.5):.0f}"
        f" | {t_flex / t_ours:.2f}x | {diff:.1e} | {t_nocap:.3f} |",
        flush=True,
    )


def main() -> None:
    only = sys.argv[1:]  # optional filter "d128"
    print(HEADER)
    print("|---" * 13 + "|")
    for d in (128, 64, 256):
        for s_ in (2048, 8192):
            for causal in (False, True):
                if not only or f"d{d}" in only:
                    one_shape(d, s_, causal)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
