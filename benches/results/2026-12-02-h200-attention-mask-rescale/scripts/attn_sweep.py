"""TMA forward configurations (sets of FLASHSCAN_* variables read on every call) against each
other, interleaved in one process: per shape, --rounds rounds of every configuration, --reps
calls each timed by CUDA events (median). bf16, batch x seqlen 16k, nheads x head_dim 2048.
--configs "name:VAR=value,VAR=value;name2:..." (an empty list: the defaults). One JSON line a
shape: TFLOP/s, the median over rounds and every round."""

import argparse
import json
import os
import statistics

import torch

import flashscan


def time_ms(fn, reps: int, chain: int = 1) -> float:
    """Median of reps timings of `chain` back-to-back calls (per call): chain > 1 keeps the GPU
    ahead of the host, so host-side launch work drops out."""
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


def parse(spec: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for part in spec.split(";"):
        name, _, vars_ = part.partition(":")
        env = dict(kv.split("=", 1) for kv in vars_.split(",") if kv)
        out.append((name, env))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="64:512,64:2048,64:16384,128:512,128:2048,128:16384")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--chain", type=int, default=1, help="back-to-back calls a timing")
    ap.add_argument("--configs", required=True)
    a = ap.parse_args()
    configs = parse(a.configs)
    touched = {k for _, env in configs for k in env}
    causal = bool(a.causal)
    for shape in a.shapes.split(","):
        d, s = (int(x) for x in shape.split(":"))
        b, h = 16384 // s, 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)
        )
        out = torch.empty_like(q)
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

        def ours(q=q, k=k, v=v, out=out) -> None:
            flashscan.flash_attn_func(q, k, v, causal=causal, out=out)

        res: dict[str, list[float]] = {name: [] for name, _ in configs}
        for _ in range(a.rounds):
            for name, env in configs:
                for key in touched:
                    os.environ.pop(key, None)
                os.environ.update(env)
                res[name].append(time_ms(ours, a.reps, a.chain))
        for key in touched:
            os.environ.pop(key, None)
        row = {"shape": f"b{b} s{s} h{h} d{d}" + (" causal" if causal else "")}
        for key, ms in res.items():
            row[key] = round(flops / statistics.median(ms) / 1e9, 1)
            row[f"{key}_all"] = [round(flops / m / 1e9, 1) for m in ms]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
