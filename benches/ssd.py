#!/usr/bin/env python3
"""Mamba-2 SSD chunked scan forward (issue 14's shapes): flashscan.mamba_chunk_scan_combined
against mamba_ssm's Triton `mamba_chunk_scan_combined` from a source checkout, in one run.

    python benches/ssd.py --mamba-src DIR [--out DIR] [--fwd-paths 1,2] [--shapes 2k,real]

The checkout needs no build (its Triton SSD imports only triton, einops and packaging; its
`__init__` is bypassed, see flashscan.bench.mamba_src.register_package). Inputs as a Mamba-2
layer passes them: x, B, C, dt in bf16, A / D / dt_bias float32, dt_softplus, z None (the gated
RMSNorm follows), chunk 256. Each row is checked before it is timed: flashscan's output against
mamba_ssm's (relative RMS error <= 2e-2, every element finite; without the peer against
flashscan's own float32 kernels on float32 copies); a failing row prints FAILED. Times: GPU
medians of triton.testing.do_bench; for the small real-time shape also the wall time per call
from Python. Forward+backward rows ("fwd+bwd"): one training step's SSD part, the forward
then torch.autograd.grad of every float input (x, dt, A, B, C, D, dt_bias) from a random dout,
checked before timing the same way (each gradient's relative RMS error against mamba_ssm's, or
without the peer against flashscan's float32 kernels on float32 copies, <= 5e-2; the worst one
shown). --fwd-paths (default 1,2): the forward rows once per SSD forward path, FLASHSCAN_SSD_FWD=1
(cuda/ssd.cu) and 2 (cuda/ssd_fwd2.cu, the 16-bit default), each checked and timed beside the
same peer in this one run ("[fwd2]" marks the second path's rows); the fwd+bwd rows use the
default forward. --bwd-paths (default 1,2): the fwd+bwd rows once per SSD backward path,
FLASHSCAN_SSD_BWD=1 (per-head chunk_dc / chunk_db) and 2 (cuda/ssd_bwd.cu section 8: CB and a
head-summed dCB), "[bwd2]" marking the second's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

import flashscan

# (name, batch, seqlen, nheads, headdim, dstate, ngroups, chunk)
SHAPES = [
    ("mamba2-2.7b b8 2k", 8, 2048, 80, 64, 128, 1, 256),
    ("mamba2-2.7b b8 8k", 8, 8192, 80, 64, 128, 1, 256),
    ("real-time b32 60", 32, 60, 8, 64, 64, 1, 256),
]
TOL = 2e-2
# The gradients of the small parameters (dA, ddt_bias, dD: sums over batch * seqlen of bf16
# products) differ more between two correct bf16 implementations than the output does; the
# guard is there to catch a broken kernel, not to rank precision (tests/test_ssd_gpu.py does).
GRAD_TOL = 5e-2


def do_bench(fn: Any) -> float:
    from triton.testing import do_bench as tb

    return tb(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def rel_rms(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def wall_us(fn: Any, n: int = 1000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def inputs(b: int, L: int, h: int, p: int, n: int, g: int) -> dict[str, Any]:
    dev, bf = "cuda", torch.bfloat16
    return {
        "x": torch.randn(b, L, h, p, device=dev, dtype=bf),
        "dt": (torch.rand(b, L, h, device=dev) * 2 - 4).to(bf),
        "A": -torch.exp(torch.rand(h, device=dev) * 2),
        "B": (torch.randn(b, L, g, n, device=dev) * n**-0.25).to(bf),
        "C": (torch.randn(b, L, g, n, device=dev) * n**-0.25).to(bf),
        "D": torch.randn(h, device=dev),
        "dt_bias": torch.rand(h, device=dev) * 0.5,
    }


def bytes_moved(a: dict[str, Any]) -> int:
    """What one forward must move at least: x, dt, B, C read, out written."""
    return sum(a[k].numel() * a[k].element_size() for k in ("x", "dt", "B", "C")) + (
        a["x"].numel() * a["x"].element_size()
    )


def set_fwd_path(path: str) -> None:
    """FLASHSCAN_SSD_FWD for the calls that follow (flashscan.ssd reads it on every call)."""
    os.environ["FLASHSCAN_SSD_FWD"] = path


def shape_row(shape: tuple, peer: Any, path: str = "1") -> dict[str, Any]:
    name, b, L, h, p, n, g, chunk = shape
    a = inputs(b, L, h, p, n, g)
    kw = dict(chunk_size=chunk, dt_softplus=True)
    label = name if path == "1" else f"{name} [fwd{path}]"
    row: dict[str, Any] = {"shape": label, "batch": b, "seqlen": L, "nheads": h, "headdim": p}
    row.update(dstate=n, ngroups=g, chunk=chunk, dtype="bfloat16", fwd_path=path)
    if peer is not None:
        ref = peer(**a, **kw)
        row["checked_against"] = "mamba_ssm"
    else:
        set_fwd_path("1")  # the float32 check runs the default path (the second is 16-bit only)
        f32 = {k: v.float() for k, v in a.items()}
        ref = flashscan.mamba_chunk_scan_combined(**f32, **kw)
        row["checked_against"] = "flashscan float32"
    set_fwd_path(path)
    ours = flashscan.mamba_chunk_scan_combined(**a, **kw)
    row["rel_rms"] = rel_rms(ours, ref)
    row["ok"] = row["rel_rms"] <= TOL
    if not row["ok"]:
        return row
    gb = bytes_moved(a) / 1e9
    row["flashscan_us"] = do_bench(lambda: flashscan.mamba_chunk_scan_combined(**a, **kw)) * 1e6
    row["flashscan_GBps"] = gb / (row["flashscan_us"] * 1e-6)
    if peer is not None:
        row["mamba_ssm_us"] = do_bench(lambda: peer(**a, **kw)) * 1e6
        row["speedup"] = row["mamba_ssm_us"] / row["flashscan_us"]
    if L <= 256:
        row["flashscan_wall_us"] = wall_us(lambda: flashscan.mamba_chunk_scan_combined(**a, **kw))
        if peer is not None:
            row["mamba_ssm_wall_us"] = wall_us(lambda: peer(**a, **kw))
    return row


GRAD_INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias")


def fwd_bwd(api: Any, a: dict[str, Any], dout: torch.Tensor, kw: dict[str, Any]) -> Any:
    """A callable running api's forward and the gradients of every float input."""
    lv = {k: v.detach().clone().requires_grad_(k in GRAD_INPUTS) for k, v in a.items()}
    leaves = [lv[k] for k in GRAD_INPUTS]

    def step() -> tuple[torch.Tensor, ...]:
        out = api(**lv, **kw)
        return torch.autograd.grad(out, leaves, dout.to(out.dtype))

    return step


def peak_mib(step: Any) -> float:
    """MiB the step allocates above what was allocated before it, at its peak (torch's caching
    allocator's count: saved activations, workspaces, gradients), after one warm call."""
    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def train_row(shape: tuple, peer: Any, bwd: str = "1") -> dict[str, Any]:
    name, b, L, h, p, n, g, chunk = shape
    a = inputs(b, L, h, p, n, g)
    kw = dict(chunk_size=chunk, dt_softplus=True)
    os.environ.pop("FLASHSCAN_SSD_FWD", None)  # the default forward
    os.environ["FLASHSCAN_SSD_BWD"] = bwd
    label = f"{name} fwd+bwd" + ("" if bwd == "1" else f" [bwd{bwd}]")
    row: dict[str, Any] = {"shape": label, "batch": b, "seqlen": L, "nheads": h}
    row.update(headdim=p, dstate=n, ngroups=g, chunk=chunk, dtype="bfloat16", bwd_path=bwd)
    dout = torch.randn(a["x"].shape, device="cuda")
    ours = fwd_bwd(flashscan.mamba_chunk_scan_combined, a, dout, kw)
    if peer is not None:
        ref_step = fwd_bwd(peer, a, dout, kw)
        row["checked_against"] = "mamba_ssm"
    else:
        f32 = {k: v.float() for k, v in a.items()}
        ref_step = fwd_bwd(flashscan.mamba_chunk_scan_combined, f32, dout, kw)
        row["checked_against"] = "flashscan float32"
    errs = {k: rel_rms(gv, rv) for k, gv, rv in zip(GRAD_INPUTS, ours(), ref_step())}
    worst = max(errs, key=lambda k: errs[k])
    row["rel_rms"] = errs[worst]
    row["worst_grad"] = "d" + worst
    row["ok"] = row["rel_rms"] <= GRAD_TOL
    if not row["ok"]:
        return row
    row["flashscan_us"] = do_bench(ours) * 1e6
    # the forward reads x, dt, B, C and writes out; the backward reads them and dout again
    # and writes dx, ddt, dB, dC: about three forwards' worth of traffic at least
    row["flashscan_GBps"] = 3 * bytes_moved(a) / 1e9 / (row["flashscan_us"] * 1e-6)
    # (the forward keeps its 16-bit H_c for the backward unless FLASHSCAN_SSD_KEEP_STATES=0:
    # memory traded for the recompute, shown beside the peer's)
    row["flashscan_peak_MiB"] = peak_mib(ours)
    if peer is not None:
        row["mamba_ssm_us"] = do_bench(ref_step) * 1e6
        row["speedup"] = row["mamba_ssm_us"] / row["flashscan_us"]
        row["mamba_ssm_peak_MiB"] = peak_mib(ref_step)
    return row


def load_peer(src: str | None) -> tuple[Any, str]:
    if not src:
        return None, "no --mamba-src given"
    try:
        from flashscan.bench.mamba_src import register_package, source_commit

        register_package(src)
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        return mamba_chunk_scan_combined, f"mamba_ssm Triton SSD, source {source_commit(src)}"
    except Exception as exc:  # triton or einops missing, an API change...
        return None, f"mamba_ssm not importable: {type(exc).__name__}: {exc}"


def fmt(rows: list[dict[str, Any]], peer_note: str) -> str:
    lines = [
        f"device: {torch.cuda.get_device_name()}; flashscan {flashscan.__version__}; "
        f"peer: {peer_note}",
        "| shape | flashscan us | GB/s | mamba_ssm us | speedup | wall us (ours / peer) | "
        "step peak MiB (ours / peer) | check |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if not r["ok"]:
            worst = f" ({r['worst_grad']})" if "worst_grad" in r else ""
            lines.append(
                f"| {r['shape']} | FAILED | | | | | | rel RMS {r['rel_rms']:.2e}{worst} vs "
                f"{r['checked_against']} |"
            )
            continue
        peer = f"{r['mamba_ssm_us']:.1f}" if "mamba_ssm_us" in r else "-"
        sp = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        wall = "-"
        if "flashscan_wall_us" in r:
            wall = f"{r['flashscan_wall_us']:.1f} / {r.get('mamba_ssm_wall_us', float('nan')):.1f}"
        mem = "-"
        if "flashscan_peak_MiB" in r:
            mem = f"{r['flashscan_peak_MiB']:.0f} / {r.get('mamba_ssm_peak_MiB', float('nan')):.0f}"
        lines.append(
            f"| {r['shape']} | {r['flashscan_us']:.1f} | {r['flashscan_GBps']:.0f} | {peer} | "
            f"{sp} | {wall} | {mem} | rel RMS {r['rel_rms']:.1e}"
            f"{' (' + r['worst_grad'] + ')' if 'worst_grad' in r else ''} vs "
            f"{r['checked_against']} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mamba-src", default=None, help="a mamba source checkout (no build needed)")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--fwd-paths", default="1,2", help="SSD forward paths to time (FLASHSCAN_SSD_FWD values)"
    )
    ap.add_argument(
        "--bwd-paths", default="1,2", help="SSD backward paths to time (FLASHSCAN_SSD_BWD values)"
    )
    ap.add_argument(
        "--shapes",
        default=None,
        help="comma-separated substrings of the shape names to run (default: all), e.g. 2k,real",
    )
    args = ap.parse_args()
    shapes = [
        s
        for s in SHAPES
        if args.shapes is None
        or any(k.strip() in s[0] for k in args.shapes.split(",") if k.strip())
    ]
    paths = [v.strip() for v in args.fwd_paths.split(",") if v.strip()]
    bwd_paths = [v.strip() for v in args.bwd_paths.split(",") if v.strip()]
    if not (torch.cuda.is_available() and flashscan.available()):
        print("no usable CUDA GPU: nothing to benchmark")
        return 0
    peer, note = load_peer(args.mamba_src)
    rows = []
    for shape in shapes:
        made = [shape_row(shape, peer, path) for path in paths]
        made.extend(train_row(shape, peer, bwd) for bwd in bwd_paths)
        for row in made:
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    text = fmt(rows, note)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ssd.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "peer": note}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
