"""Softcap on the TMA forward against the mma.sync kernel that served softcap before
(FLASHSCAN_DEV_TMA_MAX_TILE=0, a dev-only switch read on every call), interleaved in one process,
with the TMA kernel without softcap (its cost), SDPA cuDNN without softcap (no SDPA backend caps
scores) and torch's compiled flex_attention with a tanh softcap score_mod beside: per shape
--rounds rounds, each a median of --reps timings of --chain back-to-back calls. batch x seqlen
16k, nheads = 2048 // head_dim. TFLOP/s; one JSON line a shape."""

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan

CAP = 50.0


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


def flex_fn(qt, kt, vt, causal: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def softcap(score, b, h, q_idx, kv_idx):
        return CAP * torch.tanh(score / CAP)

    s = qt.shape[2]
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, s, s, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)

    def f() -> None:
        compiled(qt, kt, vt, score_mod=softcap, block_mask=mask)

    return f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--chain", type=int, default=8)
    ap.add_argument("--shapes", default="128:2048:0")
    ap.add_argument("--flex", default="", help="shapes (as in --shapes) that also run flex")
    a = ap.parse_args()
    flex_shapes = set(a.flex.split(","))
    for shape in a.shapes.split(","):
        d, s, c = (int(x) for x in shape.split(":"))
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

        def ours(cap: float, q=q, k=k, v=v, out=out, causal=causal):
            def f() -> None:
                flashscan.flash_attn_func(q, k, v, causal=causal, softcap=cap, out=out)

            return f

        def tile(t: str):
            def f() -> None:
                os.environ["FLASHSCAN_DEV_TMA_MAX_TILE"] = t

            return f

        tile("0")()
        ours(CAP)()
        ref = out.float().clone()
        tile("256")()
        out.fill_(float("nan"))
        ours(CAP)()
        diff = (out.float() - ref).abs().max().item()
        configs = {
            "mma_cap": (tile("0"), ours(CAP)),
            "tma_cap": (tile("256"), ours(CAP)),
            "tma_nocap": (tile("256"), ours(0.0)),
        }

        def cudnn(qt=qt, kt=kt, vt=vt, causal=causal) -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        peers = {"cudnn_nocap": cudnn}
        if shape in flex_shapes:
            try:
                peers["flex_cap"] = flex_fn(qt, kt, vt, causal)
            except Exception as exc:  # noqa: BLE001 - a peer that fails is a nan row
                print(f"flex {shape}: {exc!r}", flush=True)
        res: dict[str, list[float]] = {n: [] for n in [*configs, *peers]}
        for _ in range(a.rounds):
            for name, (setup, fn) in configs.items():
                setup()
                res[name].append(time_ms(fn, a.reps, a.chain))
            for name, fn in peers.items():
                try:
                    res[name].append(time_ms(fn, a.reps, a.chain))
                except Exception:  # noqa: BLE001
                    res[name].append(float("nan"))
        row = {
            "shape": f"b{b} s{s} h{h} d{d}" + (" causal" if causal else ""),
            "max|tma-mma|": diff,
        }
        for key, ms in res.items():
            row[key] = round(flops / statistics.median(ms) / 1e9, 1)
            row[f"{key}_all"] = [round(flops / m / 1e9, 1) for m in ms]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
