"""Time flashscan's Python layer alone (the native entry replaced by a no-op) at the real-time
shapes, on a machine with or without a GPU. Prints microseconds per call (best of `--repeat`
runs of `--calls` back-to-back calls).

With a GPU (`--device cuda`), tensors are real CUDA tensors and the numbers are the "python
layer only" column of tools/profile_overhead.py. Without one (`--device fake`, the default when
torch sees no GPU), CPU torch tensors are made to look like cuda:0 tensors to the Python layer:
`torch.Tensor.is_cuda` and `.get_device()` are shadowed by class attributes (True, and the C
builtin `int` for get_device: each costs about what torch's own getter costs), the backend
reports device 0 usable and the handler's stream lookup is `int` (returns 0). Everything else
(shape/stride/dtype/device/data_ptr reads, the checks, the plans, output allocation, on the
CPU) is the real code, so the numbers track the GPU host's Python layer, less the difference
between a CPU and a CUDA-caching-allocator allocation (`empty_like` alone is printed for
that) and the real stream lookup (torch._C._cuda_getCurrentRawStream).

    PYTHONPATH=python python tools/bench_python_layer.py [--device fake|cuda] [--calls N]
    PYTHONPATH=python python tools/bench_python_layer.py --training [--profile]

`--training` times a training step through `flashscan.torch` instead: the forward of a call
whose inputs require grad (the autograd path) alone, and forward + `torch.autograd.grad`, with
the native forward and backward entries stubbed (scan, attention, causal conv1d, SSD, varlen
attention; the last three also through their custom ops, the path torch.compile traces). With
`--device fake` the tensors are CPU tensors, so the autograd engine runs the backward on the
calling thread: the hand-off to the engine's CUDA device thread (part of `run_backward` on a
GPU) is not in these numbers (tools/profile_overhead.py --backward measures it on a GPU).
`--profile` adds a cProfile of each step.

To compare two versions of the package, point PYTHONPATH at each in turn.
"""

from __future__ import annotations

import argparse
import time
import types
from typing import Any, Callable

import torch


def per_call_us(
    fn: Callable[[], Any],
    calls: int,
    repeat: int,
    sync: Callable[[], None],
    clock: Callable[[], float],
) -> float:
    for _ in range(min(calls, 500)):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (clock() - t0) / calls * 1e6)
    return best


def fake_cuda() -> Callable[[], None]:
    """Make CPU tensors look like cuda:0 tensors to the Python layer; returns an undo."""
    from flashscan import _backend, _frameworks

    saved = {k: torch.Tensor.__dict__.get(k) for k in ("is_cuda", "get_device")}
    torch.Tensor.is_cuda = True  # type: ignore[misc, assignment]
    torch.Tensor.get_device = int  # type: ignore[assignment]  # int() == 0, a C call
    h = _frameworks.handler_of(torch.empty(1), "t")
    # the stream lookup (`current_stream`; `_raw_stream` in older versions of the handler)
    stream_attrs = ("current_stream", "_raw_stream")
    saved_stream = {k: h.__dict__[k] for k in stream_attrs if k in h.__dict__}
    for k in stream_attrs:
        setattr(h, k, int)  # int(device) == device: a C call
    saved_usable = _backend._usable
    _backend._usable = frozenset({0})

    def undo() -> None:
        for k, v in saved.items():
            if v is None:
                if k in torch.Tensor.__dict__:
                    delattr(torch.Tensor, k)
            else:
                setattr(torch.Tensor, k, v)
        for k in stream_attrs:
            h.__dict__.pop(k, None)
        h.__dict__.update(saved_stream)
        _backend._usable = saved_usable

    return undo


class _NoopReplay:
    """A replay plan whose launch does nothing (the scan's hot paths launch through one)."""

    def launch(self, *a: Any) -> None:
        return None


def _scan_entry(*a: Any, **kw: Any) -> Any:
    return _NoopReplay() if kw.get("replay") else None


def stub_native(*modules: types.ModuleType) -> Callable[[], None]:
    noop = types.SimpleNamespace(
        flash_attn_fwd=lambda *a, **kw: None,
        flash_attn_bwd=lambda *a, **kw: None,
        selective_scan_fwd=_scan_entry,
        selective_scan_bwd=_scan_entry,
        selective_state_update=lambda *a, **kw: None,
        kvcache_append=lambda *a, **kw: None,
        flash_attn_kvcache=lambda *a, **kw: None,
        causal_conv1d_fwd=lambda *a, **kw: None,
        causal_conv1d_bwd=lambda *a, **kw: None,
        ssd_fwd=lambda *a, **kw: None,
        ssd_bwd=lambda *a, **kw: None,
        flash_attn_varlen_fwd=lambda *a, **kw: None,
        flash_attn_varlen_bwd=lambda *a, **kw: None,
    )
    saved = [(m, m._native) for m in modules]  # type: ignore[attr-defined]
    for m in modules:
        m._native = noop  # type: ignore[attr-defined]

    def undo() -> None:
        for m, n in saved:
            m._native = n  # type: ignore[attr-defined]

    return undo


def training_cases(dev: str) -> list[tuple[str, Callable[[], Any]]]:
    """The real-time training steps through `flashscan.torch` (bf16; the scan with D, z,
    delta_bias and softplus, gradients to its 8 inputs; causal attention, gradients to q, k, v):
    the forward alone (inputs requiring grad) and forward + `torch.autograd.grad`."""
    import flashscan.torch as fst
    from flashscan.bench.training import floor_function, realtime_scan_args

    bf = torch.bfloat16
    cases: list[tuple[str, Callable[[], Any]]] = []
    for b in (1, 32):
        args = realtime_scan_args(torch, b, dev)
        leaves = [t.clone().requires_grad_() for t in args]
        dout = torch.randn_like(args[0])
        cases.append(
            (
                f"scan b{b} d512 L60 n16 fwd (grad)",
                lambda lv=leaves: fst.selective_scan_fn(*lv, delta_softplus=True),
            )
        )
        cases.append(
            (
                f"scan b{b} d512 L60 n16 fwd+bwd step",
                lambda lv=leaves, g=dout: torch.autograd.grad(
                    fst.selective_scan_fn(*lv, delta_softplus=True), lv, g
                ),
            )
        )
        floor = floor_function(torch)
        cases.append(
            (
                f"  torch alone: no-op autograd.Function, same inputs/outputs, b{b} step",
                lambda lv=leaves, g=dout, f=floor: torch.autograd.grad(f.apply(*lv), lv, g),
            )
        )
    for b in (1, 32):
        q = torch.randn(b, 60, 8, 64, device=dev).to(bf)
        ql = [t.clone().requires_grad_() for t in (q, torch.randn_like(q), torch.randn_like(q))]
        do = torch.randn_like(q)
        cases.append(
            (
                f"attention b{b} s60 h8 d64 causal fwd (grad)",
                lambda ql=ql: fst.flash_attn_func(*ql, causal=True),
            )
        )
        cases.append(
            (
                f"attention b{b} s60 h8 d64 causal fwd+bwd step",
                lambda ql=ql, g=do: torch.autograd.grad(
                    fst.flash_attn_func(*ql, causal=True), ql, g
                ),
            )
        )
    for b in (1, 32):
        for layout in ("cf", "cl"):
            # the conv1d row of benches/conv1d.py: d640 L60 width 4, bf16, SiLU, bias
            xs = torch.randn(b, 60, 640, device=dev).to(bf).transpose(1, 2)
            x = xs if layout == "cl" else xs.contiguous()
            cl = [x.clone().requires_grad_() if layout == "cf" else x.detach().requires_grad_()]
            cl += [t.requires_grad_() for t in (torch.randn(640, 4, device=dev).to(bf),)]
            cl += [torch.randn(640, device=dev).to(bf).requires_grad_()]
            gout = torch.randn_like(x)  # dout in x's layout (no transposing copy)
            name = f"conv1d b{b} d640 L60 w4 {layout}"
            cases.append(
                (
                    f"{name} fwd+bwd step",
                    lambda cl=cl, g=gout: torch.autograd.grad(
                        fst.causal_conv1d_fn(*cl, activation="silu"), cl, g
                    ),
                )
            )
            cases.append(
                (
                    f"  {name} fwd+bwd step through the custom op (the compile path)",
                    lambda cl=cl, g=gout: torch.autograd.grad(
                        torch.ops.flashscan.causal_conv1d_fwd(*cl, None, None, False, True)[0],
                        cl,
                        g,
                    ),
                )
            )
    for b in (1, 32):
        # Mamba-2's real-time SSD shape (issue 14): L60, 8 heads x 64, dstate 64, chunk 64;
        # float32 (16-bit backward calls make float32 copies: on this harness real CPU copies)
        h, p, n = 8, 64, 64
        sl = [
            torch.randn(b, 60, h, p, device=dev),
            torch.rand(b, 60, h, device=dev),
            -torch.rand(h, device=dev),
            torch.randn(b, 60, 1, n, device=dev),
            torch.randn(b, 60, 1, n, device=dev),
        ]
        sl = [t.requires_grad_() for t in sl]
        sg = torch.randn_like(sl[0])
        name = f"ssd b{b} L60 h8 p64 n64 chunk64 fp32"
        cases.append(
            (
                f"{name} fwd+bwd step",
                lambda sl=sl, g=sg: torch.autograd.grad(
                    fst.mamba_chunk_scan_combined(*sl, 64, dt_softplus=True), sl, g
                ),
            )
        )
        cases.append(
            (
                f"  {name} fwd+bwd step through the custom op (the compile path)",
                lambda sl=sl, g=sg: torch.autograd.grad(
                    torch.ops.flashscan.mamba_chunk_scan_fwd(
                        *sl, 64, None, None, None, None, None, True, 0.0, float("inf")
                    )[0],
                    sl,
                    g,
                ),
            )
        )
    # packed attention: 4 sequences of 15 tokens, 8 heads, hd64, causal
    cu = torch.tensor([0, 15, 30, 45, 60], dtype=torch.int32, device=dev)
    vq = torch.randn(60, 8, 64, device=dev).to(bf)
    vl = [t.requires_grad_() for t in (vq, torch.randn_like(vq), torch.randn_like(vq))]
    vg = torch.randn_like(vq)
    cases.append(
        (
            "varlen 4x15 h8 d64 causal fwd+bwd step",
            lambda vl=vl, g=vg: torch.autograd.grad(
                fst.flash_attn_varlen_func(*vl, cu, cu, 15, 15, causal=True), vl, g
            ),
        )
    )
    cases.append(
        (
            "  varlen 4x15 h8 d64 causal fwd+bwd step through the custom op (the compile path)",
            lambda vl=vl, g=vg: torch.autograd.grad(
                torch.ops.flashscan.flash_attn_varlen_fwd(
                    *vl, cu, cu, 15, 15, 0.125, -1, 0, 0.0, False
                )[0],
                vl,
                g,
            ),
        )
    )
    return cases


def profile(cases: list[tuple[str, Callable[[], Any]]], calls: int) -> None:
    import cProfile
    import pstats

    for name, fn in cases:
        if "step" not in name or name.startswith(" "):
            continue
        for _ in range(50):
            fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(calls):
            fn()
        pr.disable()
        print(f"==== cProfile: {name} x{calls}")
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--device", choices=("fake", "cuda"), default=None)
    # many short runs, best kept: steady even on a busy 2-core machine
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=80)
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default=None,
        help="wall: time.perf_counter (default with a GPU); cpu: this thread's CPU time, "
        "steadier on a shared machine (default without one)",
    )
    ap.add_argument(
        "--training", action="store_true", help="time training steps through flashscan.torch"
    )
    ap.add_argument("--profile", action="store_true", help="with --training: cProfile each step")
    args = ap.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "fake")
    clock_name = args.clock or ("wall" if device == "cuda" else "cpu")
    clock = time.perf_counter if clock_name == "wall" else time.thread_time

    import flashscan
    from flashscan import attention, kvcache, scan

    if device == "cuda" and not flashscan.available():
        raise SystemExit(
            f"--device cuda needs the CUDA backend (the calls would take the NumPy fallback): "
            f"{flashscan.info()['reason']}"
        )
    dev = "cuda" if device == "cuda" else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    undo_fake = fake_cuda() if device == "fake" else (lambda: None)
    bf = torch.bfloat16
    cases: list[tuple[str, Callable[[], Any]]] = []
    if args.training:
        import flashscan.torch as fst
        from flashscan import _torch_conv, conv, ssd, varlen

        undo_native = stub_native(attention, scan, fst, conv, _torch_conv, ssd, varlen)
    else:
        undo_native = stub_native(attention, kvcache, scan)
    try:
        if args.training:
            cases = training_cases(dev)
            title = "training step through flashscan.torch (native fwd/bwd = no-op)"
            if device == "fake":
                title += "; CPU autograd engine: no device-thread hand-off"
            print(f"{title}, device={device}, clock={clock_name}, torch {torch.__version__}")
            print("| case | us/call |")
            print("|---|---|")
            for name, fn in cases:
                us = per_call_us(fn, args.calls, args.repeat, sync, clock)
                print(f"| {name} | {us:.2f} |", flush=True)
            if args.profile:
                profile(cases, args.calls)
            return
        for b in (1, 32):
            q = torch.randn(b, 60, 8, 64, device=dev).to(bf)
            k, v = torch.randn_like(q), torch.randn_like(q)
            out = torch.empty_like(q)
            cases.append(
                (
                    f"attention b{b} s60 h8 d64 causal",
                    lambda q=q, k=k, v=v: flashscan.flash_attn_func(q, k, v, causal=True),
                )
            )
            cases.append(
                (
                    f"attention b{b} s60 h8 d64 causal, out=",
                    lambda q=q, k=k, v=v, o=out: flashscan.flash_attn_func(
                        q, k, v, causal=True, out=o
                    ),
                )
            )
        for b in (1, 32):
            # one decode step: append one token to a 256-slot cache, attend over it
            q1 = torch.randn(b, 1, 8, 64, device=dev).to(bf)
            kc = torch.randn(b, 256, 8, 64, device=dev).to(bf)
            vc = torch.randn_like(kc)
            lens = torch.full((b,), 60, dtype=torch.int32, device=dev)
            cases.append(
                (
                    f"kvcache decode b{b} cache256 h8 d64 causal, append 1",
                    lambda a=(q1, kc, vc, q1, q1), n=lens: flashscan.flash_attn_with_kvcache(
                        *a, cache_seqlens=n, causal=True
                    ),
                )
            )
        for b in (1, 32):
            u = torch.randn(b, 512, 60, device=dev).to(bf)
            delta = torch.rand_like(u)
            A = -torch.rand(512, 16, device=dev)
            B = torch.randn(b, 16, 60, device=dev).to(bf)
            C = torch.randn_like(B)
            D = torch.randn(512, device=dev)
            z = torch.randn_like(u)
            cases.append(
                (
                    f"scan b{b} d512 L60 n16 (D, z, softplus)",
                    lambda a=(u, delta, A, B, C, D, z): flashscan.selective_scan_fn(
                        *a, delta_softplus=True
                    ),
                )
            )
        state = torch.randn(32, 512, 16, device=dev)
        x = torch.randn(32, 512, device=dev).to(bf)
        dt = torch.rand_like(x)
        A = -torch.rand(512, 16, device=dev)
        Bs = torch.randn(32, 16, device=dev).to(bf)
        Cs = torch.randn_like(Bs)
        D = torch.randn(512, device=dev)
        cases.append(
            (
                "state_update b32 d512 n16 (D, z, dt_bias, softplus)",
                lambda: flashscan.selective_state_update(
                    state, x, dt, A, Bs, Cs, D, z=x, dt_bias=D, dt_softplus=True
                ),
            )
        )
        cases.append(("torch.empty_like(x) alone", lambda: torch.empty_like(x)))
        xs, xst = tuple(x.shape), x.stride()
        cases.append(
            ("x.new_empty_strided(shape, strides) alone", lambda: x.new_empty_strided(xs, xst))
        )

        print(
            f"python layer only (native = no-op), device={device}, clock={clock_name}, "
            f"torch {torch.__version__}"
        )
        print("| case | us/call |")
        print("|---|---|")
        for name, fn in cases:
            us = per_call_us(fn, args.calls, args.repeat, sync, clock)
            print(f"| {name} | {us:.2f} |", flush=True)
    finally:
        undo_native()
        undo_fake()


if __name__ == "__main__":
    main()
