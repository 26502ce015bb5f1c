"""In-process A/B of the hd256 wgmma backward: default vs FLASHSCAN_DEV_BWD_DQ_ONE=1 (dQ in one
m64n128 batch; a switch of the throwaway wheel 7fd42b0), alternating, backward times through
flashscan.torch (best of three rounds of 20 calls). Lint-formatted copy of what call 2 ran."""

from __future__ import annotations

import os
from typing import Callable

import torch

import flashscan.torch as fst


def time_ms(fn: Callable[[], object], reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def one_shape(b: int, s_: int, causal: bool, configs: dict[str, str]) -> str:
    h, d = 8, 256
    q, k, v = (
        torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dout = torch.randn(b, s_, h, d, device="cuda", dtype=torch.bfloat16)
    flops = 4 * b * h * s_ * s_ * d / (2 if causal else 1)
    out = fst.flash_attn_func(q, k, v, causal=causal)

    def bwd() -> object:
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    ref = None
    res: dict[str, list[float]] = {n: [] for n in configs}
    for _round in range(3):
        for name, val in configs.items():
            os.environ["FLASHSCAN_DEV_BWD_DQ_ONE"] = val
            g = bwd()
            if ref is None:
                ref = [x.float() for x in g]
            else:
                err = max(
                    float((x.float() - r).abs().max() / r.abs().max()) for x, r in zip(g, ref)
                )
                assert err < 2e-2, (name, err)
            res[name].append(time_ms(bwd))
    parts = []
    for n, ts in res.items():
        reps = " ".join(f"{x:.3f}" for x in ts)
        tf = 2.5 * flops / min(ts) / 1e9
        parts.append(f"{n} bwd {min(ts):.3f} ms ({tf:.0f} TFLOP/s) reps {reps}")
    return f"b{b} s{s_} causal={int(causal)}: " + "  ".join(parts)


if __name__ == "__main__":
    shapes = [
        (8, 2048, False),
        (8, 2048, True),
        (2, 8192, False),
        (2, 8192, True),
        (1, 16384, False),
    ]
    for b, s_, causal in shapes:
        print(one_shape(b, s_, causal, {"A": "0", "B": "1"}), flush=True)
        torch.cuda.empty_cache()
