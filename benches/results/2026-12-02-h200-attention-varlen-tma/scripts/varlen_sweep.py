"""Packed sequences on the TMA kernel against the mma.sync kernel that served them before
(FLASHSCAN_DEV_TMA_MAX_TILE=0, a dev-only switch read on every call), interleaved in one process,
and the dense TMA call of equal work (4 x 4096) beside: 9 ragged sequences of 256..4096 tokens
summing to 16k (benches/varlen.py's), bf16, nheads = 2048 // head_dim. TFLOP/s over the visible
(query, key) pairs; one JSON line a shape. Before timing, the TMA output is compared with the
mma.sync kernel's (max |diff|)."""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

import flashscan

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benches"))
from varlen import ragged_lengths  # noqa: E402


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


def pairs(lens: list[int], causal: bool) -> int:
    return sum(n * (n + 1) // 2 if causal else n * n for n in lens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--chain", type=int, default=8)
    ap.add_argument("--shapes", default="128:0,128:1")
    a = ap.parse_args()
    lens = ragged_lengths()
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    for shape in a.shapes.split(","):
        d, c = (int(x) for x in shape.split(":"))
        causal = bool(c)
        h = 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)

        def mk(*s, g=g):
            return torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)

        q, k, v = mk(total, h, d), mk(total, h, d), mk(total, h, d)
        out = torch.empty_like(q)
        dq, dk, dv = mk(4, 4096, h, d), mk(4, 4096, h, d), mk(4, 4096, h, d)
        dout = torch.empty_like(dq)
        m = max(lens)

        def varlen(q=q, k=k, v=v, out=out, causal=causal, m=m) -> None:
            flashscan.flash_attn_varlen_func(q, k, v, cu, cu, m, m, None, causal, out=out)

        def dense(dq=dq, dk=dk, dv=dv, dout=dout, causal=causal) -> None:
            flashscan.flash_attn_func(dq, dk, dv, causal=causal, out=dout)

        os.environ["FLASHSCAN_DEV_TMA_MAX_TILE"] = "0"
        varlen()
        ref = out.float().clone()
        os.environ["FLASHSCAN_DEV_TMA_MAX_TILE"] = "256"
        out.fill_(float("nan"))
        varlen()
        diff = (out.float() - ref).abs().max().item()
        res: dict[str, list[float]] = {"mma": [], "tma": [], "dense_tma_equal": []}
        for _ in range(a.rounds):
            for name, t in (("mma", "0"), ("tma", "256")):
                os.environ["FLASHSCAN_DEV_TMA_MAX_TILE"] = t
                res[name].append(time_ms(varlen, a.reps, a.chain))
            os.environ["FLASHSCAN_DEV_TMA_MAX_TILE"] = "256"
            res["dense_tma_equal"].append(time_ms(dense, a.reps, a.chain))
        flops = {
            "mma": 4.0 * pairs(lens, causal) * h * d,
            "tma": 4.0 * pairs(lens, causal) * h * d,
            "dense_tma_equal": 4.0 * pairs([4096] * 4, causal) * h * d,
        }
        row = {
            "shape": f"varlen {len(lens)} seqs {total} tokens h{h} d{d}"
            + (" causal" if causal else "")
        }
        row["max|tma-mma|"] = diff
        for key, ms in res.items():
            row[key] = round(flops[key] / statistics.median(ms) / 1e9, 1)
            row[f"{key}_all"] = [round(flops[key] / x / 1e9, 1) for x in ms]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
