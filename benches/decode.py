#!/usr/bin/env python3
"""Decode attention (one query token per sequence against a KV cache), issue 12's shapes:
flashscan.flash_attn_with_kvcache (contiguous and paged caches) against torch SDPA's cuDNN and
FlashAttention backends (enable_gqa) and our dense flash_attn_func, in one run on this GPU.

    python benches/decode.py [--out DIR]

Each row is checked before it is timed against SDPA's math backend in float32 on the same
inputs (relative RMS error <= 2e-2, every element finite): a failing row prints FAILED. Times are
GPU medians of triton.testing.do_bench with the L2 flushed before each call; GB/s counts the K/V
bytes of the valid cache rows (what a decode step must read). Also: wall time per call from
Python for the b1 4k step (and its host time alone: calls queued without waiting for the GPU), and
a CUDA-graph replay of a decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import flashscan

# (batch, q heads, kv heads, cache length); bf16, head dim 128
SHAPES = [
    (1, 32, 8, 32768),
    (8, 32, 8, 8192),
    (32, 32, 8, 4096),
    (64, 8, 8, 1024),
    (1, 32, 8, 4096),
]
HD = 128
PAGE = 256
TOL = 2e-2


def do_bench(fn) -> float:
    from triton.testing import do_bench as tb

    return tb(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def rel_rms(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def wall_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def shape_rows(b: int, h: int, hk: int, s: int) -> list[dict]:
    dt = torch.bfloat16
    q = torch.randn(b, 1, h, HD, device="cuda", dtype=dt)
    k = torch.randn(b, s, hk, HD, device="cuda", dtype=dt)
    v = torch.randn(b, s, hk, HD, device="cuda", dtype=dt)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    # the same cache, paged: blocks of PAGE tokens in a shuffled order
    nblk = s // PAGE
    perm = torch.randperm(b * nblk, device="cuda")
    table = perm.view(b, nblk).to(torch.int32)
    kp = torch.empty(b * nblk, PAGE, hk, HD, device="cuda", dtype=dt)
    vp = torch.empty_like(kp)
    kp[perm] = k.reshape(b * nblk, PAGE, hk, HD)
    vp[perm] = v.reshape(b * nblk, PAGE, hk, HD)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(
            qt.float(), kt.float(), vt.float(), enable_gqa=True
        ).transpose(1, 2)
    kv_bytes = 2 * b * s * hk * HD * 2
    impls = {
        "flashscan kvcache": lambda: flashscan.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens),
        "flashscan kvcache paged": lambda: flashscan.flash_attn_with_kvcache(
            q, kp, vp, cache_seqlens=lens, block_table=table
        ),
        "flashscan dense": lambda: flashscan.flash_attn_func(q, k, v),
    }
    for name, backend in (
        ("sdpa cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
        ("sdpa flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION),
        ("sdpa efficient", torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION),
    ):

        def call(backend=backend):
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True).transpose(1, 2)

        impls[name] = call
    rows = []
    for name, fn in impls.items():
        row = {"shape": f"b{b} h{h}/{hk} cache {s}", "impl": name, "status": "ok"}
        try:
            err = rel_rms(fn(), ref)
            row["rel_rms"] = err
            if not err <= TOL:
                row["status"] = "FAILED"
            row["us"] = do_bench(fn) * 1e6
            row["gbps"] = kv_bytes / (row["us"] * 1e-6) / 1e9
        except Exception as exc:  # a backend that declines the shape
            row["status"] = "n/a" if name.startswith("sdpa") else "FAILED"
            row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def host_us(fn, n: int = 200) -> float:
    """Host time per call with the GPU left behind: n calls queued after a sync, timed without
    waiting for them (n * 3 launches stay under the driver's queue depth)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


def step_costs() -> dict:
    """b1, 32/8 heads, 4k cache, one new token appended: wall per call and graph replay."""
    dt = torch.bfloat16
    q = torch.randn(1, 1, 32, HD, device="cuda", dtype=dt)
    kc = torch.randn(1, 4097, 8, HD, device="cuda", dtype=dt)
    vc = torch.randn_like(kc)
    kn = torch.randn(1, 1, 8, HD, device="cuda", dtype=dt)
    vn = torch.randn_like(kn)
    lens = torch.full((1,), 4096, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def step():
        return flashscan.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, out=out)

    res = {
        "host_us_append_step": host_us(step),
        "host_us_no_append": host_us(
            lambda: flashscan.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, out=out)
        ),
        "wall_us_append_step": wall_us(step),
        "wall_us_no_append": wall_us(
            lambda: flashscan.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, out=out)
        ),
    }
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(200):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    res["graph_us_append_step"] = e0.elapsed_time(e1) * 1e3 / 200
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available() or not flashscan.available():
        print("no usable CUDA GPU: nothing to benchmark")
        return 0
    torch.manual_seed(0)
    rows = []
    for shape in SHAPES:
        rows += shape_rows(*shape)
        torch.cuda.empty_cache()
    steps = step_costs()
    lines = [
        f"# Decode attention, {torch.cuda.get_device_name()}, bf16 hd{HD}, one query token",
        "",
        f"torch {torch.__version__}; flashscan {flashscan.__version__} "
        f"(commit {os.environ.get('FLASHSCAN_COMMIT', 'unknown')}); paged = {PAGE}-token pages "
        "in shuffled order; GB/s = K/V bytes of the cache / GPU time",
        "",
        "| shape | impl | status | GPU time | K/V GB/s | rel RMS vs fp32 math |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        t = f"{r['us']:.1f} µs" if "us" in r else "—"
        bw = f"{r['gbps']:.0f}" if "gbps" in r else "—"
        err = f"{r['rel_rms']:.1e}" if "rel_rms" in r else r.get("note", "")
        lines.append(f"| {r['shape']} | {r['impl']} | {r['status']} | {t} | {bw} | {err} |")
    lines += ["", "Decode step b1 32/8 heads hd128, 4k cache, one token appended (out= given):"]
    lines += [f"- {k}: {v:.1f} µs" for k, v in steps.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "steps": steps}, f, indent=1)
    bad = [r for r in rows if r["impl"].startswith("flashscan") and r["status"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
