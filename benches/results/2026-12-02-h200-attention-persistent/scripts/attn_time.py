"""Attention forward TFLOP/s, ours beside SDPA cuDNN (and FlashAttention-2) in this process: bf16,
batch x seqlen 16k, nheads x head_dim 2048 (issue 11's sweep), causal and not, plus the real-time
shape. CUDA events, median of --reps calls. One JSON line a row."""

import argparse
import json
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan


def time_ms(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")
    ap.add_argument("--peers", action="store_true", help="SDPA cuDNN beside ours")
    ap.add_argument("--fa2", action="store_true", help="and SDPA FlashAttention-2")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seqlens", default="512,1024,2048,4096,16384")
    ap.add_argument("--causal-seqlens", default="512,1024,2048,4096,16384")
    a = ap.parse_args()
    shapes = []
    for d in (64, 128):
        for causal in (False, True):
            lens = a.causal_seqlens if causal else a.seqlens
            for s in map(int, lens.split(",")):
                shapes.append((16384 // s, s, 2048 // d, d, causal))
    shapes.append((32, 60, 8, 64, True))
    for b, s, h, d, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)
        )
        out = torch.empty_like(q)
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        row = {"tag": a.tag, "shape": f"b{b} s{s} h{h} d{d}" + (" causal" if causal else "")}

        def ours(q=q, k=k, v=v, causal=causal, out=out) -> None:
            flashscan.flash_attn_func(q, k, v, causal=causal, out=out)

        ms = time_ms(ours, a.reps)
        row["ours_us"] = round(ms * 1e3, 2)
        row["ours_tflops"] = round(flops / ms / 1e9, 1)
        if a.peers:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            backends = [("cudnn", SDPBackend.CUDNN_ATTENTION)]
            if a.fa2:
                backends.append(("fa2", SDPBackend.FLASH_ATTENTION))
            for name, be in backends:

                def peer(qt=qt, kt=kt, vt=vt, causal=causal) -> None:
                    torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                with sdpa_kernel([be]):
                    ms = time_ms(peer, a.reps)
                row[f"{name}_us"] = round(ms * 1e3, 2)
                row[f"{name}_tflops"] = round(flops / ms / 1e9, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
