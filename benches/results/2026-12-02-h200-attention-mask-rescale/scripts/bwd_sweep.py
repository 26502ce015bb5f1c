"""Attention backward configurations (sets of FLASHSCAN_* variables read on every call) against
each other, interleaved in one process: per shape, --rounds rounds of every configuration, each a
median of --reps timings of --chain back-to-back torch.autograd.grad calls (the backward kernels
only: the forward ran once, its graph retained). bf16, batch x seqlen 16k, nheads x head_dim 2048.
One JSON line a shape: backward TFLOP/s (2.5 x the forward's FLOPs), median and every round."""

import argparse
import json
import os
import statistics

import torch

import flashscan.torch as fst


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
    ap.add_argument("--shapes", default="64:2048:0,64:2048:1,128:2048:0,128:2048:1")
    ap.add_argument("--configs", required=True)
    a = ap.parse_args()
    configs = []
    for part in a.configs.split(";"):
        name, _, vars_ = part.partition(":")
        configs.append((name, dict(kv.split("=", 1) for kv in vars_.split(",") if kv)))
    touched = {k for _, env in configs for k in env}
    for shape in a.shapes.split(","):
        d, s, c = (int(x) for x in shape.split(":"))
        causal = bool(c)
        b, h = max(1, 16384 // s), 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        leaves = [
            torch.randn(
                b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g
            ).requires_grad_()
            for _ in range(3)
        ]
        dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        out = fst.flash_attn_func(*leaves, causal=causal)
        flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

        def step(out=out, leaves=leaves, dout=dout) -> None:
            torch.autograd.grad(out, leaves, dout, retain_graph=True)

        res: dict[str, list[float]] = {name: [] for name, _ in configs}
        for _ in range(a.rounds):
            for name, env in configs:
                for key in touched:
                    os.environ.pop(key, None)
                os.environ.update(env)
                res[name].append(time_ms(step, a.reps, a.chain))
        for key in touched:
            os.environ.pop(key, None)
        row = {"shape": f"b{b} s{s} h{h} d{d}" + (" causal" if causal else "")}
        for key, ms in res.items():
            row[key] = round(flops / statistics.median(ms) / 1e9, 1)
            row[f"{key}_all"] = [round(flops / m / 1e9, 1) for m in ms]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
