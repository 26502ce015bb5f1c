"""TMA forward configurations (FLASHSCAN_SM90_PERSIST values, read on every call) against each
other and SDPA cuDNN, interleaved in one process: per shape, --rounds rounds of (each
configuration, cuDNN), --reps calls each timed by CUDA events (median). bf16, batch x seqlen 16k,
nheads x head_dim 2048. One JSON line a shape: TFLOP/s, the median over rounds and every round."""

import argparse
import json
import os
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan


def time_ms(fn, reps: int) -> float:
    for _ in range(3):
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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seqlens", default="512,2048,16384")
    ap.add_argument("--causal-seqlens", default="512,1024,2048,4096,16384")
    ap.add_argument("--configs", default="default=,one=0,queue=queue", help="name=value,...")
    ap.add_argument("--causal-configs", default="default=,one=0")
    a = ap.parse_args()
    for d in (64, 128):
        for causal in (False, True):
            lens = a.causal_seqlens if causal else a.seqlens
            configs = [
                c.split("=", 1) for c in (a.causal_configs if causal else a.configs).split(",")
            ]
            for s in (int(x) for x in lens.split(",") if x):
                b, h = 16384 // s, 2048 // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (
                    torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                    for _ in range(3)
                )
                out = torch.empty_like(q)
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

                def ours(q=q, k=k, v=v, out=out, causal=causal) -> None:
                    flashscan.flash_attn_func(q, k, v, causal=causal, out=out)

                def cudnn(qt=qt, kt=kt, vt=vt, causal=causal) -> None:
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        torch.nn.functional.scaled_dot_product_attention(
                            qt, kt, vt, is_causal=causal
                        )

                res: dict[str, list[float]] = {name: [] for name, _ in configs}
                res["cudnn"] = []
                for _ in range(a.rounds):
                    for name, val in configs:
                        if val:
                            os.environ["FLASHSCAN_SM90_PERSIST"] = val
                        else:
                            os.environ.pop("FLASHSCAN_SM90_PERSIST", None)
                        res[name].append(time_ms(ours, a.reps))
                    os.environ.pop("FLASHSCAN_SM90_PERSIST", None)
                    res["cudnn"].append(time_ms(cudnn, a.reps))
                row = {"shape": f"b{b} s{s} h{h} d{d}" + (" causal" if causal else "")}
                for key, ms in res.items():
                    row[key] = round(flops / statistics.median(ms) / 1e9, 1)
                    row[f"{key}_all"] = [round(flops / m / 1e9, 1) for m in ms]
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
