# ruff: noqa: B023, E501, E731  (a profiling script: lambdas bound per loop iteration on purpose)
"""Where the per-call time goes at the real-time shapes: the whole public call, the Python
layer alone (native entry replaced by a no-op), the native entry alone (descriptors prebuilt),
and the GPU time (CUDA graph replay). With --backward: a training step instead (the API
forward, the custom ops, the autograd step), then a cProfile of each step. Prints
microseconds per call. Needs a GPU.

    python tools/profile_overhead.py [--backward]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import types

import torch

import flashscan
from flashscan import _native, attention, scan
from flashscan.bench.timing import best_wall_us
from flashscan.bench.training import floor_function, realtime_scan_args


def wall_us(fn) -> float:
    return best_wall_us(fn, torch.cuda.synchronize, calls=3000, warmup=200)


def graph_us(fn, n: int = 200) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000 / (n * 20)


def desc(t: torch.Tensor) -> tuple:
    name = str(t.dtype).removeprefix("torch.")
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), name, 2, t.device.index)


def stub_native(module: types.ModuleType):
    real = module._native
    noop = types.SimpleNamespace(
        **{k: (lambda *a, **kw: None) for k in dir(real) if not k.startswith("_")}
    )
    return real, noop


def forward() -> None:
    dev = "cuda"
    bf = torch.bfloat16
    rows = []
    # attention, real-time shape
    for batch in (1, 32):
        q = torch.randn(batch, 60, 8, 64, device=dev, dtype=bf)
        k, v = torch.randn_like(q), torch.randn_like(q)
        out = torch.empty_like(q)
        stream = torch.cuda.current_stream().cuda_stream
        call = lambda: flashscan.flash_attn_func(q, k, v, causal=True)  # noqa: E731
        call_out = lambda: flashscan.flash_attn_func(q, k, v, causal=True, out=out)  # noqa: E731
        d = [desc(t) for t in (q, k, v, out)]
        native = lambda: _native.flash_attn_fwd(
            d[0], d[1], d[2], d[3], None, 0.125, -1, 0, 0.0, stream
        )  # noqa: E731
        real, noop = stub_native(attention)
        attention._native = noop
        py_only = wall_us(call)
        attention._native = real
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        rows.append(
            (
                f"attention b{batch} s60 h8 d64 bf16 causal",
                wall_us(call),
                wall_us(call_out),
                py_only,
                wall_us(native),
                graph_us(call_out),
                wall_us(sdpa),
            )
        )
    # scan, game shape
    for batch in (1, 32):
        u = torch.randn(batch, 512, 60, device=dev, dtype=bf)
        delta = torch.rand_like(u)
        A = -torch.rand(512, 16, device=dev)
        B = torch.randn(batch, 16, 60, device=dev, dtype=bf)
        C = torch.randn_like(B)
        D = torch.randn(512, device=dev)
        z = torch.randn_like(u)
        out = torch.empty_like(u)
        call = lambda: flashscan.selective_scan_fn(u, delta, A, B, C, D, z, delta_softplus=True)  # noqa: E731
        stream = torch.cuda.current_stream().cuda_stream
        d = [desc(t) for t in (u, delta, A, B, C, D, z, out)]
        native = lambda: _native.selective_scan_fwd(
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], None, None, d[7], None, True, stream
        )  # noqa: E731
        real, noop = stub_native(scan)
        scan._native = noop
        py_only = wall_us(call)
        scan._native = real
        rows.append(
            (
                f"scan b{batch} d512 L60 n16 bf16",
                wall_us(call),
                float("nan"),
                py_only,
                wall_us(native),
                graph_us(native),
                float("nan"),
            )
        )
    # state update, game shape
    state = torch.randn(32, 512, 16, device=dev)
    x = torch.randn(32, 512, device=dev, dtype=bf)
    dt = torch.rand_like(x)
    A = -torch.rand(512, 16, device=dev)
    Bs = torch.randn(32, 16, device=dev, dtype=bf)
    Cs = torch.randn_like(Bs)
    D = torch.randn(512, device=dev)
    out = torch.empty_like(x)
    call = lambda: flashscan.selective_state_update(
        state, x, dt, A, Bs, Cs, D, z=x, dt_bias=D, dt_softplus=True
    )  # noqa: E731
    stream = torch.cuda.current_stream().cuda_stream
    d = [desc(t) for t in (state, x, dt, A, Bs, Cs, D, out)]
    native = lambda: _native.selective_state_update(
        d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[1], d[6], d[7], True, stream
    )  # noqa: E731
    real, noop = stub_native(scan)
    scan._native = noop
    py_only = wall_us(call)
    scan._native = real
    rows.append(
        (
            "state_update b32 d512 n16 bf16",
            wall_us(call),
            float("nan"),
            py_only,
            wall_us(native),
            graph_us(native),
            float("nan"),
        )
    )
    empty = wall_us(lambda: torch.empty_like(x))
    print(f"torch.empty_like alone: {empty:.2f} us")
    print(
        "| shape | public call | with out= | python layer only | native only | GPU (graph) | torch SDPA |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | " + " | ".join(f"{v:.1f}" for v in r[1:]) + " |")


def _scan_step_rows(b: int) -> list:
    """Training-step rows of the scan at (b, d512, L60, n16), bf16, D / z / delta_bias."""
    import flashscan.torch as fst

    ops = torch.ops.flashscan
    args = realtime_scan_args(torch, b)
    leaves = [t.clone().requires_grad_() for t in args]
    dout = torch.randn_like(args[0])
    empty = args[0].new_empty((0,), dtype=torch.float32)
    floor = floor_function(torch)

    def scan_step():
        return torch.autograd.grad(
            fst.selective_scan_fn(*leaves, delta_softplus=True), leaves, dout
        )

    def floor_step():
        return torch.autograd.grad(floor.apply(*leaves), leaves, dout)

    def on_caller(step):
        """The step with the autograd engine on the calling thread (no hand-off to its CUDA
        device thread): what run_backward's hand-off costs, by difference."""

        def run():
            with torch.autograd.set_multithreading_enabled(False):
                return step()

        return run

    return [
        (
            f"b{b} scan fwd (API, no grad)",
            lambda: flashscan.selective_scan_fn(*args, delta_softplus=True),
        ),
        (f"b{b} scan fwd op (saving)", lambda: ops.selective_scan_fwd(*args, None, True, True)),
        (f"b{b} scan bwd op", lambda: ops.selective_scan_bwd(dout, None, *args, None, empty, True)),
        (f"b{b} scan fwd+bwd step (autograd)", scan_step),
        (f"b{b} scan step, engine on caller", on_caller(scan_step)),
        (f"b{b} torch alone: no-op Function step", floor_step),
        (f"b{b} torch alone, engine on caller", on_caller(floor_step)),
    ], {f"b{b} scan step": scan_step}


def backward() -> None:
    """Training steps at the real-time shapes (scan b1 / b32 d512 L60 n16; b32 s60 h8 d64 causal
    attention), bf16: each layer's per-call wall time, beside torch's own floor (a no-op
    autograd.Function over the same inputs), then a cProfile and a torch.profiler table of
    each step."""
    import flashscan.torch as fst

    ops = torch.ops.flashscan
    bf = torch.bfloat16
    rows, steps = [], {}
    for b in (1, 32):
        r, s = _scan_step_rows(b)
        rows += r
        steps.update(s)
    q = torch.randn(32, 60, 8, 64, device="cuda", dtype=bf)
    k, v = torch.randn_like(q), torch.randn_like(q)
    ql = [t.clone().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)
    out, lse = ops.flash_attn_fwd(q, k, v, 0.125, -1, 0, 0.0, False)
    attn_step = lambda: torch.autograd.grad(fst.flash_attn_func(*ql, causal=True), ql, do)
    rows += [
        ("attn fwd (API, no grad)", lambda: flashscan.flash_attn_func(q, k, v, causal=True)),
        ("attn fwd op", lambda: ops.flash_attn_fwd(q, k, v, 0.125, -1, 0, 0.0, False)),
        (
            "attn bwd op",
            lambda: ops.flash_attn_bwd(do, q, k, v, out, lse, 0.125, -1, 0, 0.0, False),
        ),
        ("attn fwd+bwd step (autograd)", attn_step),
    ]
    steps["attn step"] = attn_step
    for name, fn in rows:
        print(
            f"{name:<40} {best_wall_us(fn, torch.cuda.synchronize, calls=300, warmup=100, repeat=5):8.1f} us"
        )
    for name, fn in steps.items():
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        print(f"==== cProfile: {name} x200")
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    from torch.profiler import ProfilerActivity, profile

    for name, fn in steps.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
        print(f"==== torch.profiler: {name} x50 (self CPU time, us in total over 50 steps)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--backward", action="store_true", help="profile a training step instead")
    if ap.parse_args().backward:
        backward()
    else:
        forward()


if __name__ == "__main__":
    main()
