"""A/B of one `flashscan.selective_scan_fn` forward call's host cost (no autograd), and of one
`flashscan.selective_state_update` call's, in one process: the native server (D: one native
call, torch tensors read through torch's DLPack C exchange table), the Python layer's replay
plans (C: the server off), and descriptor calls (B: replays off too); with `--mamba-src`,
mamba_ssm's own `selective_scan_fn` (its CUDA kernel built from the checkout) under
torch.no_grad in the same bursts. The GPU host's timings drift by tens of percent between
processes, so the variants run in alternating bursts and each row is the median over bursts.
The call: the real-time shape (d512 L60 n16 bf16, D / z / delta_bias, softplus) at batch 1 and
32. The state update (D: its native server; C: the Python layer's descriptor calls; with
`--mamba-triton`, mamba_ssm's Triton `selective_state_update` imported from the checkout, no
build) at the shapes of `SSU_SHAPES`. flashscan.torch's scan and attention under torch.no_grad
(the core route against the autograd Function they took before); causal_conv1d_update (D
against the Python layer's general path); mamba_chunk_scan_combined at the real-time shape (D,
C, and with `--mamba-triton` mamba_ssm's Triton version). Every variant's output is checked
against D's first.

    python tools/serve_host_ab.py [--bursts 16] [--calls 100] [--mamba-src DIR]
        [--mamba-triton DIR]
    python tools/serve_host_ab.py --breakdown
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

import flashscan
import flashscan.scan as scan
from flashscan.bench.training import realtime_scan_args

_SERVER = scan._make_server()
_SSU_SERVER = scan._make_ssu_server()


def mode(m: str) -> None:
    """D: the native server; C: the Python layer with replay plans; B: descriptor calls."""
    scan._SERVER = _SERVER if m == "D" else False
    scan._SERVE = _SERVER.serve if m == "D" else None
    scan.REPLAYS_PER_PLAN = 0 if m == "B" else 8
    if m == "B":
        for plan in scan._SCAN_PLANS.values():
            plan[-1].clear()


def ssu_mode(m: str) -> None:
    """The state update's D (native server) or C (the Python layer's descriptor calls)."""
    scan._SSU_SERVER = _SSU_SERVER if m == "D" else False
    scan._SSU_SERVE = _SSU_SERVER.serve if m == "D" else None


# (label, batch, nheads, dim, dstate): the game's decode step, the decode shape, a
# Mamba-2 2.7B-like layer (80 heads x 64, state 128); bf16, D / z / dt_bias, softplus
SSU_SHAPES = [
    ("ssu b32 d512 n16", 32, None, 512, 16),
    ("ssu b64 d5120 n16", 64, None, 5120, 16),
    ("ssu b64 h80x64 n128", 64, 80, 64, 128),
]


def ssu_rows(mamba_ssu: Any) -> dict[str, Callable[[], Any]]:
    rows: dict[str, Callable[[], Any]] = {}
    for label, b, h, d, n in SSU_SHAPES:
        lead = (b,) if h is None else (b, h)
        hd = () if h is None else (h,)
        bc = (b, n) if h is None else (b, 1, n)
        dev, bf = "cuda", torch.bfloat16
        s = {
            "x": torch.randn(*lead, d, device=dev).to(bf),
            "dt": (torch.rand(*lead, d, device=dev) * 3.5 - 3.0).to(bf),
            "A": -torch.exp(torch.rand(*hd, d, n, device=dev) * 2.5 - 1.0),
            "B": torch.randn(*bc, device=dev).to(bf),
            "C": torch.randn(*bc, device=dev).to(bf),
            "D": torch.randn(*hd, d, device=dev),
            "z": torch.randn(*lead, d, device=dev).to(bf),
            "dt_bias": torch.rand(*hd, d, device=dev) - 0.5,
        }
        state0 = torch.randn(*lead, d, n, device=dev) * 0.1

        def variant(m: str, s: Any = s, s0: Any = state0, st: Any = None) -> Callable[[], Any]:
            st = s0.clone() if st is None else st

            def run() -> Any:
                if (scan._SSU_SERVE is not None) != (m == "D"):
                    ssu_mode(m)
                return flashscan.selective_state_update(st, **s, dt_softplus=True)

            return run

        for m in ("D", "C"):
            for _ in range(3):
                variant(m)()
        sd, sc = state0.clone(), state0.clone()
        yd = variant("D", st=sd)()
        yc = variant("C", st=sc)()
        assert torch.equal(yd, yc) and torch.equal(sd, sc), label
        rows[f"{label} D native server"] = variant("D")
        rows[f"{label} C Python layer"] = variant("C")
        if mamba_ssu is not None:

            def peer(s: Any = s, st: Any = state0.clone(), f: Any = mamba_ssu) -> Any:  # noqa: B008
                return f(st, **s, dt_softplus=True)

            yp = peer(st=state0.clone())
            err = float((yp.float() - yd.float()).abs().max())
            assert err <= 5e-2 * float(yd.float().abs().max()), (label, err)
            rows[f"{label} mamba_ssm Triton"] = peer
    return rows


def conv_rows() -> dict[str, Callable[[], Any]]:
    """causal_conv1d_update, bf16, width 4, bias, silu: D (native server) vs C (the Python
    layer's general path, which is every call's route without the server)."""
    import flashscan.conv as conv

    server = conv._make_update_server()
    assert server, "this build has no conv update server"

    def conv_mode(m: str) -> None:
        conv._UPDATE_SERVER = server if m == "D" else False
        conv._UPDATE_SERVE = server.serve if m == "D" else None

    rows: dict[str, Callable[[], Any]] = {}
    for label, b, d in (("conv update b32 d640", 32, 640), ("conv update b64 d5376", 64, 5376)):
        x = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(d, 4, device="cuda")
        bias = torch.randn(d, device="cuda")
        state0 = torch.randn(b, d, 3, device="cuda", dtype=torch.bfloat16)

        def variant(
            m: str, x: Any = x, w: Any = w, bias: Any = bias, st: Any = None, s0: Any = state0
        ) -> Callable[[], Any]:
            st = s0.clone() if st is None else st

            def run() -> Any:
                if (conv._UPDATE_SERVE is not None) != (m == "D"):
                    conv_mode(m)
                return flashscan.causal_conv1d_update(x, st, w, bias, activation="silu")

            return run

        sd, sc = state0.clone(), state0.clone()
        yd, yc = variant("D", st=sd)(), variant("C", st=sc)()
        assert torch.equal(yd, yc) and torch.equal(sd, sc), label
        rows[f"{label} D native server"] = variant("D")
        rows[f"{label} C Python layer"] = variant("C")
    conv_mode("D")
    return rows


def ssd_rows(mamba_ssd: Any) -> dict[str, Callable[[], Any]]:
    """mamba_chunk_scan_combined at the real-time shape (b32 L60, 8 heads x 64, state 64,
    bf16, D, z, dt_bias, softplus, chunk 256): D (native server) vs C (the Python layer's hot
    path), and mamba_ssm's Triton version when given."""
    import flashscan.ssd as ssd

    server = ssd._make_server()
    assert server, "this build has no SSD server"

    def ssd_mode(m: str) -> None:
        ssd._SERVER = server if m == "D" else False
        ssd._SERVE = server.serve if m == "D" else None

    b, L, h, p, n = 32, 60, 8, 64, 64
    dev, bf = "cuda", torch.bfloat16
    a = {
        "x": torch.randn(b, L, h, p, device=dev).to(bf),
        "dt": torch.rand(b, L, h, device=dev) * 2 - 2.5,
        "A": -torch.exp(torch.rand(h, device=dev) * 2 - 1),
        "B": (torch.randn(b, L, 1, n, device=dev) * n**-0.25).to(bf),
        "C": (torch.randn(b, L, 1, n, device=dev) * n**-0.25).to(bf),
        "D": torch.randn(h, device=dev),
        "z": torch.randn(b, L, h, p, device=dev).to(bf),
        "dt_bias": torch.rand(h, device=dev) * 0.5,
    }

    def variant(m: str) -> Callable[[], Any]:
        def run() -> Any:
            if (ssd._SERVE is not None) != (m == "D"):
                ssd_mode(m)
            return flashscan.mamba_chunk_scan_combined(**a, chunk_size=256, dt_softplus=True)

        return run

    for m in ("D", "C"):
        for _ in range(3):
            variant(m)()
    want = variant("D")()
    assert torch.equal(variant("C")(), want)
    rows = {
        "ssd b32 L60 8x64 n64 D native server": variant("D"),
        "ssd b32 L60 8x64 n64 C Python layer": variant("C"),
    }
    if mamba_ssd is not None:

        def peer(a: Any = a, f: Any = mamba_ssd) -> Any:
            return f(**a, chunk_size=256, dt_softplus=True)

        err = float((peer().float() - want.float()).abs().max())
        assert err <= 5e-2 * float(want.float().abs().max()), err
        rows["ssd b32 L60 8x64 n64 mamba_ssm Triton"] = peer
    ssd_mode("D")
    return rows


def torch_rows() -> dict[str, Callable[[], Any]]:
    """flashscan.torch's scan and attention under torch.no_grad: the core route (now) against
    the autograd Function (the route before, called directly)."""
    import flashscan.torch as fst

    rows: dict[str, Callable[[], Any]] = {}
    x = realtime_scan_args(torch, 32)
    q = torch.randn(32, 60, 8, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(32, 60, 8, 64, device="cuda", dtype=torch.bfloat16)
    scale = 64**-0.5

    def scan_core() -> Any:
        if scan._SERVE is None or scan.REPLAYS_PER_PLAN != 8:  # the server on (rows before
            mode("D")  # may have left B or C)
        with torch.no_grad():
            return fst.selective_scan_fn(*x, delta_softplus=True)

    def scan_function() -> Any:
        if scan._SERVE is None or scan.REPLAYS_PER_PLAN != 8:
            mode("D")
        with torch.no_grad():
            return fst._SelectiveScan.apply(*x, None, True, False, False)

    def attn_core() -> Any:
        with torch.no_grad():
            return fst.flash_attn_func(q, kv, kv, causal=True)

    def attn_function() -> Any:
        with torch.no_grad():
            return fst._FlashAttn.apply(q, kv, kv, scale, -1, 0, 0.0, False, False)

    for _ in range(3):
        assert torch.equal(scan_core(), scan_function())
        assert torch.equal(attn_core(), attn_function())
    rows["fst scan b32, no_grad: core route"] = scan_core
    rows["fst scan b32, no_grad: autograd Function (before)"] = scan_function
    rows["fst attention b32 s60 h8 d64 causal, no_grad: core route"] = attn_core
    rows["fst attention b32 s60 h8 d64 causal, no_grad: autograd Function (before)"] = attn_function
    return rows


def burst(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(wall us per call, synchronised; host us per call: the loop alone, before the
    synchronise) over `calls` back-to-back calls. Where the GPU's time per call exceeds the
    host's, wall is the GPU's and host is what the caller's thread spends."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6, (t1 - t0) / calls * 1e6


def breakdown(calls: int = 300) -> None:
    """Host us per call of the served call's parts at b32 (min over 5 runs of `calls`, the GPU
    queue drained between runs): what the rest of the native server's time is made of."""
    import flashscan.torch as fst
    from flashscan import _native

    x = realtime_scan_args(torch, 32)
    u = x[0]
    ins9 = (*x, None)
    mode("D")
    for _ in range(3):
        flashscan.selective_scan_fn(*x, delta_softplus=True)
    out = torch.empty_like(u)
    descs = [fst._desc(t, f"a{i}") for i, t in enumerate(x)] + [None]
    replay = _native.selective_scan_fwd(
        *descs, fst._desc(out, "out"), None, True, None, replay=True
    )
    ptrs = [t.data_ptr() for t in x] + [0, out.data_ptr(), 0, 0]
    stream = torch.cuda.current_stream().cuda_stream
    shape = tuple(u.shape)
    parts: dict[str, Callable[[], Any]] = {
        "flashscan.selective_scan_fn (served)": lambda: flashscan.selective_scan_fn(
            *x, delta_softplus=True
        ),
        "ScanServer.serve, direct": lambda: _SERVER.serve(*ins9, True, False, False),
        "ScanFwdReplay.launch (raw pointers)": lambda: replay.launch(*ptrs, stream),
        "u.new_empty(shape)": lambda: u.new_empty(shape),
        "torch_exchange_read(u) (+ table lookup)": lambda: _native.torch_exchange_read(u),
        "torch.is_grad_enabled()": torch.is_grad_enabled,
        "a trivial native call": lambda: _native.scan_saved_state_count(60),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
    }
    print("| part (b32) | host us per call |")
    print("|---|---:|")
    for k, fn in parts.items():
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        print(f"| {k} | {best:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bursts", type=int, default=16)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--mamba-src", help="a state-spaces/mamba checkout: its forward as a peer")
    ap.add_argument("--mamba-build", help="its build directory (default: inside the checkout)")
    ap.add_argument("--breakdown", action="store_true", help="time the served call's parts")
    ap.add_argument("--only", default="", help="time only the rows whose name holds this")
    ap.add_argument(
        "--mamba-triton", help="a state-spaces/mamba checkout: its Triton state update as a peer"
    )
    args = ap.parse_args()
    assert _SERVER and _SSU_SERVER, "this build has no native servers"
    if args.breakdown:
        breakdown()
        return
    mamba_fn = None
    if args.mamba_src:
        from flashscan.bench import mamba_src

        info = mamba_src.load(args.mamba_src, args.mamba_build, print)
        print(f"mamba_ssm: {info}")
        if not info["error"]:
            from mamba_ssm.ops.selective_scan_interface import selective_scan_fn as mamba_fn
    rows: dict[str, Callable[[], Any]] = {}
    for b in (1, 32):
        ins = realtime_scan_args(torch, b)

        def variant(m: str, x: Any = ins) -> Callable[[], Any]:
            def run() -> Any:
                if scan.REPLAYS_PER_PLAN != (0 if m == "B" else 8) or (
                    (scan._SERVE is not None) != (m == "D")
                ):
                    mode(m)
                return flashscan.selective_scan_fn(*x, delta_softplus=True)

            return run

        for m in ("D", "C", "B"):
            for _ in range(3):  # the third call of a signature is served as planned
                variant(m)()
        want = variant("D")()
        for m in ("C", "B"):
            assert torch.equal(variant(m)(), want), m
        rows[f"b{b} D native server"] = variant("D")
        rows[f"b{b} C Python layer, replay plans"] = variant("C")
        rows[f"b{b} B Python layer, descriptors"] = variant("B")
        if mamba_fn is not None:

            def peer(x: Any = ins, f: Any = mamba_fn) -> Any:
                with torch.no_grad():
                    return f(*x[:5], D=x[5], z=x[6], delta_bias=x[7], delta_softplus=True)

            got = peer()
            err = float((got.float() - want.float()).abs().max())
            assert err <= 5e-2 * float(want.float().abs().max()), err
            rows[f"b{b} mamba_ssm (no grad)"] = peer
    mamba_ssu = mamba_ssd = None
    if args.mamba_triton:
        from flashscan.bench import mamba_src

        mamba_src.register_package(args.mamba_triton)
        from mamba_ssm.ops.triton.selective_state_update import (
            selective_state_update as mamba_ssu,
        )
        from mamba_ssm.ops.triton.ssd_combined import (
            mamba_chunk_scan_combined as mamba_ssd,
        )
    rows.update(ssu_rows(mamba_ssu))
    rows.update(ssd_rows(mamba_ssd))
    rows.update(torch_rows())
    rows.update(conv_rows())
    if args.only:
        rows = {k: v for k, v in rows.items() if args.only in k}
    for fn in rows.values():  # warm-up
        burst(fn, 50)
    wall: dict[str, list[float]] = {k: [] for k in rows}
    host: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.bursts):
        for k, fn in rows.items():
            w, h = burst(fn, args.calls)
            wall[k].append(w)
            host[k].append(h)
    mode("D")
    ssu_mode("D")
    print(
        f"{torch.cuda.get_device_name()}; {args.bursts} alternating bursts of {args.calls} calls; "
        "us per call, median over bursts (25th-75th percentile)"
    )
    print("| row | wall (synchronised) | host (issue loop) |")
    print("|---|---:|---:|")
    for k in rows:
        cells = []
        for v in (wall[k], host[k]):
            q = statistics.quantiles(v, n=4)
            cells.append(f"{statistics.median(v):.1f} ({q[0]:.1f}-{q[2]:.1f})")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
