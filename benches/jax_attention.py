#!/usr/bin/env python3
"""Attention inside jax.jit: flashscan.jax.flash_attn_func (an XLA custom call of our kernels on
XLA's stream) against jax.nn.dot_product_attention with implementation="cudnn" and "xla", in
one run on this GPU, forward and forward + backward (jax.grad), bf16.

    python benches/jax_attention.py [--out DIR] [--quick]

Each row is checked before it is timed against the same attention computed by XLA in float32
on the same inputs: its max error must be at most 2x cuDNN's (the same-precision baseline)
plus 1e-3, every element finite; a failing row prints FAIL. Times are medians over repeats of
a jitted call (block_until_ready around a batch of calls, so dispatch overlaps execution as in
a training loop); TFLOP/s counts 4 * b * h * sq * sk * d (halved under causal), 3.5x that for
forward + backward (the backward is 2.5x the forward).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flashscan import jax as fj

# (batch, seqlen, q heads, kv heads, head dim, causal)
SHAPES = [
    (1, 64, 8, 8, 64, True),  # real-time sized: per-call overhead dominates
    (16, 512, 16, 16, 64, False),
    (4, 2048, 16, 16, 128, True),
    (2, 4096, 32, 8, 128, True),
    (1, 8192, 16, 16, 128, True),
    (8, 1024, 16, 16, 128, False),
]
QUICK = [SHAPES[0], SHAPES[2], SHAPES[3]]


def peers(causal: bool) -> dict[str, Callable[..., Any]]:
    def flashscan_fn(q, k, v):
        return fj.flash_attn_func(q, k, v, causal=causal)

    def cudnn_fn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def xla_fn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

    return {"flashscan": flashscan_fn, "cudnn": cudnn_fn, "xla": xla_fn}


def fwd_bwd(fn):
    def loss(q, k, v, w):
        return (fn(q, k, v).astype(jnp.float32) * w).sum()

    return jax.grad(loss, argnums=(0, 1, 2))


def timeit(f, args, reps: int = 20, inner: int = 10) -> float:
    out = f(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def max_err(got, ref) -> float:
    got = np.asarray(got, np.float32)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - np.asarray(ref, np.float32)).max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for results.json and results.md")
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    a = ap.parse_args()
    dev = jax.devices()[0]
    if dev.platform != "gpu":
        print(f"no GPU for jax (device {dev}); nothing to measure", file=sys.stderr)
        return 1
    rows, failed = [], False
    header = (
        f"device: {dev.device_kind}; jax {jax.__version__}; commit "
        f"{os.environ.get('FLASHSCAN_COMMIT', 'unknown')}; bf16\n"
    )
    print(header)
    print(
        "| shape (b, s, h, hk, d, causal) | pass | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms "
        "| fwd+bwd TFLOP/s | max err (ref f32) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in QUICK if a.quick else SHAPES:
        b, s, h, hk, d, causal = shape
        rng = np.random.default_rng(0)
        q = jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16)
        k = jnp.asarray(rng.standard_normal((b, s, hk, d)), jnp.bfloat16)
        v = jnp.asarray(rng.standard_normal((b, s, hk, d)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.float32)
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        ref = jax.jit(peers(causal)["xla"])(*f32)
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        fns = peers(causal)
        errs = {}
        for name, fn in fns.items():
            try:
                errs[name] = max_err(jax.jit(fn)(q, k, v), ref)
            except Exception as e:  # a peer that cannot run this shape (cuDNN limits)
                errs[name] = None
                print(f"| {shape} | skip | {name} | {type(e).__name__}: {str(e)[:80]} |||||")
        base = errs.get("cudnn")
        for name, fn in fns.items():
            err = errs[name]
            if err is None:
                continue
            ok = np.isfinite(err) and (base is None or err <= 2 * base + 1e-3)
            failed |= name == "flashscan" and not ok
            t_f = timeit(jax.jit(fn), (q, k, v))
            t_fb = timeit(jax.jit(fwd_bwd(fn)), (q, k, v, w))
            row = {
                "shape": shape,
                "impl": name,
                "pass": bool(ok),
                "fwd_ms": t_f * 1e3,
                "fwd_tflops": flops / t_f / 1e12,
                "fwd_bwd_ms": t_fb * 1e3,
                "fwd_bwd_tflops": 3.5 * flops / t_fb / 1e12,
                "max_err": err,
            }
            rows.append(row)
            print(
                f"| {shape} | {'ok' if ok else 'FAIL'} | {name} | {row['fwd_ms']:.3f} | "
                f"{row['fwd_tflops']:.1f} | {row['fwd_bwd_ms']:.3f} | "
                f"{row['fwd_bwd_tflops']:.1f} | {err:.2e} |",
                flush=True,
            )
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(
                {"device": dev.device_kind, "jax": jax.__version__, "rows": rows}, f, indent=1
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
