#!/usr/bin/env python3
"""Per-kernel GPU time of the Mamba-2 SSD (forward on both paths, forward+backward) and of the
channel-last conv1d forward, from torch.profiler's CUDA activity: which launch holds the time,
so that tuning starts where the time is. GPU only.

    python tools/ssd_profile.py [--shape 2k|8k|rt|c128] [--reps 5] [--mamba-src DIR] [--fwd-only]
                                [--paths 1,2|2]

Prints one table per measured call: kernel name, launches per call, GPU us per call, share.
--mamba-src (a state-spaces/mamba snapshot, imported as benches/ssd.py does: triton + einops, no
build) adds the same tables for mamba_ssm's Triton SSD in the same process, so each of our
kernels sits beside the peer's stage it replaces; --fwd-only skips the forward+backward and
conv1d tables (the Triton backward's first autotune takes minutes). --ncu-range fwd|step: no
tables; three warm-up calls (compiles, autotunes), then one call of ours (or, with --mamba-src,
the peer's) between cudaProfilerStart / Stop, for
`ncu --profile-from-start off --set full -k regex:ssd2_chunk_scan python tools/ssd_profile.py ...`.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from typing import Any, Callable

SHAPES = {
    # batch, seqlen, nheads, headdim, dstate, ngroups, chunk (issue 14's shapes)
    "2k": (8, 2048, 80, 64, 128, 1, 256),
    "8k": (8, 8192, 80, 64, 128, 1, 256),
    "rt": (32, 60, 8, 64, 64, 1, 256),
    "c128": (4, 4096, 32, 64, 64, 1, 128),  # chunk 128, state 64: another register / tile budget
}


def ssd_inputs(torch: Any, shape: tuple[int, ...], dtype: Any) -> dict[str, Any]:
    b, L, h, p, n, g, _ = shape
    dev = "cuda"
    return {
        "x": torch.randn(b, L, h, p, device=dev, dtype=dtype),
        "dt": torch.randn(b, L, h, device=dev, dtype=dtype) * 0.5 - 1.0,
        "A": -torch.rand(h, device=dev) * 2.0 - 0.5,
        "B": torch.randn(b, L, g, n, device=dev, dtype=dtype),
        "C": torch.randn(b, L, g, n, device=dev, dtype=dtype),
        "D": torch.randn(h, device=dev),
        "dt_bias": torch.randn(h, device=dev) * 0.1,
    }


def profile(torch: Any, name: str, fn: Callable[[], Any], reps: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
            per[ev.name].append(ev.device_time_total if hasattr(ev, "device_time_total") else 0.0)
    rows = []
    for k, ts in per.items():
        rows.append((sum(ts) / reps, len(ts) / reps, k))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) or 1.0
    print(f"\n## {name}: {total:.1f} us of kernels per call ({reps} calls)\n")
    print("| kernel | launches/call | us/call | share |")
    print("| --- | ---: | ---: | ---: |")
    for us, n, k in rows[:20]:
        print(f"| `{k[:90]}` | {n:.1f} | {us:.1f} | {100 * us / total:.0f}% |")


def peer_ssd(src: str) -> Callable[..., Any]:
    """mamba_ssm's Triton `mamba_chunk_scan_combined`, imported from the snapshot `src`."""
    from flashscan.bench.mamba_src import register_package

    register_package(src)
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined


def training_step(
    torch: Any, f: Callable[..., Any], a: dict[str, Any], chunk: int
) -> Callable[[], Any]:
    """A forward through `f` and `autograd.grad` to every input (fresh leaves, one fixed dout)."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in a.items()}
    dout = torch.randn_like(a["x"])

    def step() -> Any:
        out = f(**leaves, chunk_size=chunk, dt_softplus=True)
        return torch.autograd.grad(out, list(leaves.values()), dout)

    return step


def profile_peer(
    torch: Any, src: str, name: str, a: dict[str, Any], chunk: int, reps: int, fwd_only: bool
) -> None:
    """mamba_ssm's Triton SSD (`mamba_chunk_scan_combined` from the snapshot `src`) on the same
    inputs: its five forward kernels (and, unless fwd_only, the forward+backward's)."""
    from flashscan.bench.mamba_src import source_commit

    tri = peer_ssd(src)
    label = f"mamba_ssm Triton SSD (source {source_commit(src)})"
    profile(
        torch, f"{label} forward {name}", lambda: tri(**a, chunk_size=chunk, dt_softplus=True), reps
    )
    if not fwd_only:
        step = training_step(torch, tri, a, chunk)
        profile(torch, f"{label} forward+backward {name}", step, max(2, reps // 2))


def ncu_range(
    torch: Any, fst: Any, src: str | None, a: dict[str, Any], chunk: int, step: bool
) -> None:
    """One call of ours (or of the peer's, given its snapshot) inside a profiler range."""
    f = peer_ssd(src) if src else fst.mamba_chunk_scan_combined
    if step:
        call = training_step(torch, f, a, chunk)
    else:

        def call() -> Any:
            return f(**a, chunk_size=chunk, dt_softplus=True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="2k", choices=sorted(SHAPES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--mamba-src", default=None, help="a mamba source snapshot: profile its Triton SSD"
    )
    ap.add_argument("--fwd-only", action="store_true", help="forward tables only")
    ap.add_argument(
        "--paths",
        default="1,2",
        help="the SSD paths to profile, forward and backward (FLASHSCAN_SSD_FWD / _BWD): 1,2 or 2",
    )
    ap.add_argument("--ncu-range", choices=["fwd", "step"], default=None)
    args = ap.parse_args()
    import torch

    import flashscan.torch as fst

    shape = SHAPES[args.shape]
    chunk = shape[-1]
    a = ssd_inputs(torch, shape, torch.bfloat16)
    if args.ncu_range:
        ncu_range(torch, fst, args.mamba_src, a, chunk, args.ncu_range == "step")
        return
    if args.mamba_src:
        profile_peer(torch, args.mamba_src, args.shape, a, chunk, args.reps, args.fwd_only)
    paths = [v for v in args.paths.split(",") if v in ("1", "2")]
    for path in paths:
        os.environ["FLASHSCAN_SSD_FWD"] = path

        def fwd() -> Any:
            return fst.mamba_chunk_scan_combined(**a, chunk_size=chunk, dt_softplus=True)

        profile(torch, f"SSD forward {args.shape} bf16, FLASHSCAN_SSD_FWD={path}", fwd, args.reps)
    os.environ.pop("FLASHSCAN_SSD_FWD", None)
    if args.fwd_only:
        return
    step = training_step(torch, fst.mamba_chunk_scan_combined, a, chunk)
    for bwd in paths:
        os.environ["FLASHSCAN_SSD_BWD"] = bwd
        name = f"SSD forward+backward {args.shape} bf16 (default forward, FLASHSCAN_SSD_BWD={bwd})"
        profile(torch, name, step, max(2, args.reps // 2))
    os.environ.pop("FLASHSCAN_SSD_BWD", None)

    # Mamba-2 channel-last conv1d forward (x as (b, d, L) with stride 1 on d)
    b, L = shape[0], shape[1]
    d = 5376 if args.shape != "rt" else 640
    x = torch.randn(b, L, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w = torch.randn(d, 4, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    profile(
        torch,
        f"conv1d forward channel-last b{b} L{L} d{d} silu",
        lambda: fst.causal_conv1d_fn(x, w, bias, activation="silu"),
        args.reps,
    )


if __name__ == "__main__":
    main()
