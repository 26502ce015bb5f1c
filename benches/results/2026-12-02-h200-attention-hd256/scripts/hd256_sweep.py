"""Head dim 256 (and 136-248 padded to it) on the TMA kernel in each schedule against the
mma.sync kernel (FLASHSCAN_DEV_TMA_MAX_TILE=128, a dev-only switch read on every call),
interleaved in one process, with SDPA cuDNN and FlashAttention-2 beside them: per shape --rounds
rounds, each a median of --reps timings of --chain back-to-back calls. batch x seqlen 16k,
nheads = 2048 // head_dim. TFLOP/s with the real head dim; one JSON line a shape."""

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
    ap.add_argument("--shapes", default="96:2048:0,96:2048:1")
    a = ap.parse_args()
    for shape in a.shapes.split(","):
        d, s, c, *dt = shape.split(":")
        d, s, causal = int(d), int(s), bool(int(c))
        dtype = torch.float16 if dt == ["fp16"] else torch.bfloat16
        b, h = max(1, 16384 // s), 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3)
        )
        out = torch.empty_like(q)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

        def ours(q=q, k=k, v=v, out=out, causal=causal) -> None:
            flashscan.flash_attn_func(q, k, v, causal=causal, out=out)

        def peer(be, qt=qt, kt=kt, vt=vt, causal=causal):
            def f() -> None:
                with sdpa_kernel(be):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            return f

        # the padded path against the float64-free check of the mma.sync kernel's output
        def setter(tile: str, sched: str):
            def f() -> None:
                os.environ["FLASHSCAN_DEV_TMA_MAX_TILE"] = tile
                os.environ["FLASHSCAN_DEV_SCHED"] = sched

            return f

        configs = {
            "mma": setter("128", ""),
            "pingpong": setter("256", "pingpong"),
            "pipe": setter("256", "pipe"),
            "plain": setter("256", "plain"),
        }
        configs["mma"]()
        ours()
        ref = out.float().clone()
        diff = {}
        for name in ("pingpong", "pipe", "plain"):
            configs[name]()
            out.fill_(float("nan"))
            ours()
            diff[name] = (out.float() - ref).abs().max().item()
        res: dict[str, list[float]] = {n: [] for n in [*configs, "cudnn", "fa2"]}
        for _ in range(a.rounds):
            for name, setup in configs.items():
                setup()
                res[name].append(time_ms(ours, a.reps, a.chain))
            for name, be in (
                ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("fa2", SDPBackend.FLASH_ATTENTION),
            ):
                try:
                    res[name].append(time_ms(peer(be), a.reps, a.chain))
                except RuntimeError:
                    res[name].append(float("nan"))
        row = {
            "shape": f"b{b} s{s} h{h} d{d}" + (" causal" if causal else "") + f" {str(dtype)[6:]}",
            "max|tma-mma|": diff,
        }
        for key, ms in res.items():
            row[key] = round(flops / statistics.median(ms) / 1e9, 1)
            row[f"{key}_all"] = [round(flops / m / 1e9, 1) for m in ms]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
