"""Varlen attention backward on the H200: flashscan's wgmma backward (its varlen TMA build, the
default; its cp.async build, FLASHSCAN_SM90_BWD_TMA=0) vs the mma.sync backward
(FLASHSCAN_SM90_BWD=0), alternating in one process;
the dense wgmma backward (TMA build) on the same tokens cut into equal lengths for reference;
SDPA over nested (jagged) tensors as the peer (its FlashAttention-2 / cuDNN backends where they
take jagged inputs). bf16, 16k tokens, nheads x hd = 2048, ragged lengths."""

import os
import random
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


def lengths(mean: int, total: int, seed: int) -> list[int]:
    r = random.Random(seed)
    out = []
    while sum(out) < total:
        out.append(min(total - sum(out), max(1, int(r.uniform(0.25, 1.75) * mean))))
    return out


def one(d: int, mean: int, causal: bool) -> None:
    h = 2048 // d
    lens = lengths(mean, 16384, mean + d)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    n = sum(lens)
    q, k, v = (
        torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dout = torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16)
    pairs = sum(x * x for x in lens) / (2 if causal else 1)
    flops = 4 * h * d * pairs
    mx = max(lens)
    out = fst.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal)

    def bwd():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    configs = {"tma": ("1", "1"), "cp": ("1", "0"), "mma": ("0", "1")}  # SM90_BWD, SM90_BWD_TMA
    res, grads = {c: [] for c in configs}, {}
    for _round in range(3):
        for c, (sm90, tma) in configs.items():
            os.environ["FLASHSCAN_SM90_BWD"], os.environ["FLASHSCAN_SM90_BWD_TMA"] = sm90, tma
            grads.setdefault(c, [x.float() for x in bwd()])
            res[c].append(time_ms(bwd))
    os.environ["FLASHSCAN_SM90_BWD"], os.environ["FLASHSCAN_SM90_BWD_TMA"] = "1", "1"
    diff = max(
        float((x - r).abs().max() / r.abs().max())
        for c in ("tma", "cp")
        for x, r in zip(grads[c], grads["mma"])
    )

    def step():
        o = fst.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal)
        torch.autograd.grad(o, (q, k, v), dout)

    t_step = min(time_ms(step) for _ in range(2))
    # dense wgmma backward over the same number of tokens at the mean length (TMA build)
    b = 16384 // mean
    qd, kd, vd = (
        torch.randn(b, mean, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dd = torch.randn(b, mean, h, d, device="cuda", dtype=torch.bfloat16)
    od = fst.flash_attn_func(qd, kd, vd, causal=causal)
    t_dense = min(
        time_ms(lambda: torch.autograd.grad(od, (qd, kd, vd), dd, retain_graph=True))
        for _ in range(2)
    )
    flops_dense = 4 * h * d * b * mean * mean / (2 if causal else 1)
    # peer: SDPA over jagged nested tensors (b, j, h, d) -> (b, h, j, d)
    t_peer, peer = float("nan"), "-"
    try:
        offs = cu.long()  # one offsets tensor: one ragged size for q, k, v, out and dout
        nts = [
            torch.nested.nested_tensor_from_jagged(t.detach(), offs)
            .transpose(1, 2)
            .requires_grad_()
            for t in (q, k, v)
        ]
        dn = torch.nested.nested_tensor_from_jagged(dout, offs).transpose(1, 2)
        for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            try:
                be = getattr(torch.nn.attention.SDPBackend, backend)

                def peer_step(be=be):
                    with torch.nn.attention.sdpa_kernel(be):
                        o = torch.nn.functional.scaled_dot_product_attention(*nts, is_causal=causal)
                    torch.autograd.grad(o, nts, dn)

                t = min(time_ms(peer_step) for _ in range(2))
                if not t_peer <= t:
                    t_peer, peer = t, backend
            except Exception as exc:  # noqa: BLE001
                print(
                    f"sdpa {backend} d{d}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr
                )
    except Exception as exc:  # noqa: BLE001
        print(f"nested d{d}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr)
    a, cp, m = min(res["tma"]), min(res["cp"]), min(res["mma"])
    print(
        f"| {d} | {mean} | {len(lens)} | {int(causal)} | {a:.3f} | {cp:.3f} | {m:.3f}"
        f" | {cp / a:.2f}x | {m / a:.2f}x"
        f" | {2.5 * flops / a / 1e9:.0f} | {2.5 * flops / cp / 1e9:.0f}"
        f" | {2.5 * flops / m / 1e9:.0f}"
        f" | {3.5 * flops / t_step / 1e9:.0f} | {2.5 * flops_dense / t_dense / 1e9:.0f}"
        f" | {3.5 * flops / t_peer / 1e9:.0f} ({peer}) | {diff:.1e} |",
        flush=True,
    )


def main() -> None:
    print(
        "| hd | mean len | seqs | causal | wgmma TMA bwd ms | wgmma cp.async bwd ms"
        " | mma.sync bwd ms | TMA / cp.async | TMA / mma.sync | wgmma TMA bwd TFLOP/s"
        " | cp.async bwd TFLOP/s | mma.sync bwd TFLOP/s | wgmma fwd+bwd TFLOP/s"
        " | dense wgmma bwd TFLOP/s (mean len) | SDPA jagged fwd+bwd TFLOP/s | max rel diff |"
    )
    print("|---" * 16 + "|")
    for d in (128, 64, 256):
        for mean in (1024, 4096):
            for causal in (False, True):
                one(d, mean, causal)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
