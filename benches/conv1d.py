#!/usr/bin/env python3
"""The causal conv1d of a Mamba block (issue 14): flashscan.causal_conv1d_fn (forward,
forward + backward) and causal_conv1d_update against causal-conv1d built from a checkout
(--conv1d-src DIR) and torch's depthwise F.conv1d, in one run on this GPU.

    python benches/conv1d.py [--conv1d-src DIR] [--conv1d-build DIR] [--quick] [--out DIR]

Shapes: Mamba-2 2.7B-like (dim = 5120 + 2 * 128 = 5376, width 4, bias, SiLU; batch 8, seqlen 2k
and 8k; the channel-last layout Mamba-2 passes and the channel-first one of Mamba-1), the small
real-time one (batch 32, seqlen 60, dim 8 * 64 + 2 * 64 = 640) and decode steps. bf16.

Each row is checked before it is timed against F.conv1d in float32 on the same inputs (relative
RMS error <= 1e-2, every element finite; gradients too for the backward rows): a failing row
prints FAILED. Times are GPU medians of triton.testing.do_bench; "GPU us" is the device time of
every kernel of one call (torch.profiler, 5 calls), which the host's speed does not move: an
autograd step's do_bench median carries its host gaps (causal-conv1d's forward+backward moved
by 1.3x between two processes on the same GPU, 2026-11-28), so its rows compare on GPU us.
Bytes: what the op must move (forward: x read + out written; forward + backward: that plus x,
dout read and dx written; update: x, the state read and written, out written); "of copy" divides
that rate by this GPU's measured device-to-device copy rate (read + write of 1 GiB). Targets
(issue 14): >= 85 % of copy and >= 1.2x causal-conv1d.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

import flashscan
import flashscan.torch as fst
from flashscan.bench.timing import kernel_us

DIM2 = 5120 + 2 * 128
# (name, batch, dim, seqlen, layout)
SHAPES = [
    ("mamba2 b8 2k cl", 8, DIM2, 2048, "cl"),
    ("mamba2 b8 8k cl", 8, DIM2, 8192, "cl"),
    ("mamba1 b8 2k cf", 8, 5120, 2048, "cf"),
    ("mamba1 b8 8k cf", 8, 5120, 8192, "cf"),
    ("realtime b32 60 cl", 32, 640, 60, "cl"),
    ("realtime b32 60 cf", 32, 640, 60, "cf"),
]
DECODE = [(64, DIM2), (256, DIM2), (32, 640)]
WIDTH = 4
TOL = 1e-2


def do_bench(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench as tb

    return tb(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def rel_rms(got: Any, ref: Any) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def copy_rate() -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src))
    return 2 * (1 << 30) / t


def make_x(b: int, d: int, n: int, layout: str) -> Any:
    if layout == "cl":
        return torch.randn(b, n, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return torch.randn(b, d, n, device="cuda", dtype=torch.bfloat16)


def torch_conv(x: Any, w: Any, b: Any) -> Any:
    y = F.conv1d(F.pad(x, (w.shape[1] - 1, 0)), w.unsqueeze(1), b, groups=x.shape[1])
    return F.silu(y)


def timed_row(
    name: str,
    impls: dict[str, Callable[[], Any]],
    check: Callable[[Any], float],
    nbytes: int,
    copy: float,
) -> list[dict[str, Any]]:
    rows = []
    for impl, fn in impls.items():
        row: dict[str, Any] = {"shape": name, "impl": impl, "bytes": nbytes}
        try:
            err = check(fn())
            row["rel_rms"] = err
            if not err <= TOL:
                row["status"] = "FAILED"
            else:
                t = do_bench(fn)
                row.update(
                    status="ok", us=t * 1e6, gbps=nbytes / t / 1e9, of_copy=nbytes / t / copy
                )
                try:  # the profiler's view is extra: a row it fails on stays timed
                    row["gpu_us"] = kernel_us(torch, fn)
                except Exception as exc:
                    row["gpu_us_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        except Exception as exc:  # a peer that cannot take this shape: reported, not fatal
            row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        rows.append(row)
    return rows


def forward_row(peer: Any, copy: float, name: str, b: int, d: int, n: int, layout: str) -> list:
    x = make_x(b, d, n, layout)
    w = torch.randn(d, WIDTH, device="cuda", dtype=torch.bfloat16) / WIDTH
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    ref = torch_conv(x.float(), w.float(), bias.float())
    impls = {
        "flashscan": lambda: flashscan.causal_conv1d_fn(x, w, bias, activation="silu"),
        "torch F.conv1d": lambda: torch_conv(x, w, bias),
    }
    if peer is not None:
        impls["causal-conv1d"] = lambda: peer.causal_conv1d_fn(x, w, bias, activation="silu")
    nbytes = 2 * x.numel() * x.element_size()
    return timed_row(f"fwd {name}", impls, lambda o: rel_rms(o, ref), nbytes, copy)


def backward_row(peer: Any, copy: float, name: str, b: int, d: int, n: int, layout: str) -> list:
    x = make_x(b, d, n, layout).requires_grad_()
    w = (torch.randn(d, WIDTH, device="cuda", dtype=torch.bfloat16) / WIDTH).requires_grad_()
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dout = make_x(b, d, n, layout)  # the gradient arrives in the output's layout, x's
    leaves = (x, w, bias)
    xf = [t.detach().float().requires_grad_() for t in leaves]
    ref = torch.autograd.grad(torch_conv(*xf), xf, dout.float())

    def run(f: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(f(x, w, bias), leaves, dout)

    impls = {
        "flashscan": run(lambda x, w, b: fst.causal_conv1d_fn(x, w, b, activation="silu")),
        "torch F.conv1d": run(torch_conv),
    }
    if peer is not None:
        impls["causal-conv1d"] = run(
            lambda x, w, b: peer.causal_conv1d_fn(x, w, b, activation="silu")
        )
    nbytes = 5 * x.numel() * x.element_size()

    def check(grads: Any) -> float:
        return max(rel_rms(g, r) for g, r in zip(grads, ref))

    return timed_row(f"fwd+bwd {name}", impls, check, nbytes, copy)


def update_row(peer: Any, copy: float, b: int, d: int) -> list:
    x = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
    state = torch.randn(b, d, WIDTH - 1, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(d, WIDTH, device="cuda", dtype=torch.bfloat16) / WIDTH
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    full = torch.cat([state, x[:, :, None]], dim=2).float()
    ref = F.silu((full * w.float()[None]).sum(-1) + bias.float())
    mine, theirs_state = state.clone(), state.clone()

    def ours() -> Any:
        mine.copy_(state)  # each timed call starts from the same state (counted in bytes)
        return flashscan.causal_conv1d_update(x, mine, w, bias, activation="silu")

    def theirs() -> Any:
        theirs_state.copy_(state)
        return peer.causal_conv1d_update(x, theirs_state, w, bias, activation="silu")

    impls = {"flashscan": ours}
    if peer is not None:
        impls["causal-conv1d"] = theirs
    nbytes = x.element_size() * (2 * x.numel() + 4 * state.numel())  # + the restoring copy
    return timed_row(f"update b{b} d{d}", impls, lambda o: rel_rms(o, ref), nbytes, copy)


def all_rows(peer: Any, copy: float, shapes: list[Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        rows += forward_row(peer, copy, *shape)
        torch.cuda.empty_cache()
    for shape in shapes:
        rows += backward_row(peer, copy, *shape)
        torch.cuda.empty_cache()
    for b, d in DECODE:
        rows += update_row(peer, copy, b, d)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conv1d-src", default=None, help="a causal-conv1d source checkout")
    ap.add_argument("--conv1d-build", default=None, help="build directory for --conv1d-src")
    ap.add_argument("--quick", action="store_true", help="the 2k and real-time shapes only")
    ap.add_argument("--out", default=None, help="write results.json / results.md here")
    args = ap.parse_args()
    assert flashscan.available(), flashscan.info()
    peer, peer_info = None, {}
    if args.conv1d_src:
        from flashscan.bench import conv1d_src

        peer_info = conv1d_src.load(args.conv1d_src, args.conv1d_build, print)
        peer = peer_info.pop("module")
    shapes = [s for s in SHAPES if not (args.quick and "8k" in s[0])]
    copy = copy_rate()
    rows = all_rows(peer, copy, shapes)
    lines = [
        f"device: {torch.cuda.get_device_name()}, flashscan {flashscan.__version__} "
        f"({os.environ.get('FLASHSCAN_COMMIT', 'unknown')}), copy {copy / 1e9:.0f} GB/s, "
        f"causal-conv1d: {peer_info or 'not built (no --conv1d-src)'}",
        "",
        "| row | impl | us | GB/s | of copy | vs causal-conv1d | GPU us | vs (GPU us) | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    peers = {r["shape"]: r for r in rows if r["impl"] == "causal-conv1d"}
    for r in rows:
        us, gpu = r.get("us"), r.get("gpu_us")
        p = peers.get(r["shape"], {})
        vs = f"{p['us'] / us:.2f}x" if us and p.get("us") else ""
        vs_gpu = f"{p['gpu_us'] / gpu:.2f}x" if gpu and p.get("gpu_us") else ""
        lines.append(
            f"| {r['shape']} | {r['impl']} | {us or 0:.1f} | {r.get('gbps', 0):.0f} | "
            f"{100 * r.get('of_copy', 0):.0f} % | {vs} | {gpu or 0:.1f} | {vs_gpu} | "
            f"{r['status']} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump({"copy_bytes_per_s": copy, "peer": peer_info, "rows": rows}, f, indent=1)
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
