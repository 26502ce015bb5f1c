"""Part of the softmax's exps on the FMA pipe (FS_EXP_POLY=N of 16 column pairs, through the
FLASHSCAN_SM90_EXP_POLY read on every call) against all on MUFU (0), interleaved in one
process, SDPA cuDNN beside: per shape --rounds rounds, each a median of --reps timings of
--chain back-to-back calls. bf16, batch x seqlen 16k, nheads = 2048 // hd. One JSON line a shape
(shape d:s:causal[:cap]; configs from --polys)."""

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan


def time_ms(fn, reps: int, chain: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(chain):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / chain)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--chain", type=int, default=8)
    ap.add_argument("--shapes", default="64:2048:0")
    ap.add_argument("--polys", default="0,2,3,4")
    a = ap.parse_args()
    polys = a.polys.split(",")
    for shape in a.shapes.split(","):
        d, s, c, *cap = (int(x) for x in shape.split(":"))
        cap = float(cap[0]) if cap else 0.0
        causal = bool(c)
        b, h = max(1, 16384 // s), 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)
        )
        out = torch.empty_like(q)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

        def ours(q=q, k=k, v=v, out=out, causal=causal, cap=cap) -> None:
            flashscan.flash_attn_func(q, k, v, causal=causal, softcap=cap, out=out)

        def cudnn(qt=qt, kt=kt, vt=vt, causal=causal) -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        os.environ["FLASHSCAN_SM90_EXP_POLY"] = "0"
        ours()
        ref = out.float().clone()
        diff = {}
        for n in polys[1:]:
            os.environ["FLASHSCAN_SM90_EXP_POLY"] = n
            out.fill_(float("nan"))
            ours()
            diff[n] = (out.float() - ref).abs().max().item()
        res: dict[str, list[float]] = {f"poly{n}": [] for n in polys}
        res["cudnn_nocap"] = []
        for _ in range(a.rounds):
            for n in polys:
                os.environ["FLASHSCAN_SM90_EXP_POLY"] = n
                res[f"poly{n}"].append(time_ms(ours, a.reps, a.chain))
            res["cudnn_nocap"].append(time_ms(cudnn, a.reps, a.chain))
        name = f"b{b} s{s} h{h} d{d}" + (" causal" if causal else "")
        name += f" cap{cap:g}" if cap else ""
        row = {"shape": name, "max|diff vs poly0|": diff}
        for key, ms in res.items():
            row[key] = round(flops / statistics.median(ms) / 1e9, 1)
            row[f"{key}_all"] = [round(flops / m / 1e9, 1) for m in ms]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
