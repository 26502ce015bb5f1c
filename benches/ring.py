#!/usr/bin/env python3
"""Ring attention on several GPUs (issue 15's measurement), one process per GPU:

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 benches/ring.py [--out DIR]

For each sequence length (bf16, head dim 128), causal (zig-zag layout) and not, forward and
forward + backward:
- ring: flashscan.distributed.ring_flash_attn_func on the local shards;
- single: flashscan.flash_attn_func over the whole sequence on one GPU (every rank runs it on
  its own GPU at once), the work the ring splits: scaling efficiency = single / (world * ring);
- allgather: all_gather K and V (contiguous shards), then one local flash_attn_func of the
  local queries against the keys they see (causal: the prefix, bottom-right aligned), the
  simple alternative to a ring. Its causal work is unbalanced: the slowest rank sets the time.
TFLOP/s per GPU counts the attention FLOPs of the whole sequence (4 * b * h * S^2 * d forward,
halved when causal; backward 2.5x the forward) over world * time. Times are medians of CUDA
event timings after warm-up, the max over ranks, each iteration started by a barrier.
Before timing, the ring's output is checked against the all-gather path's (same precision,
relative RMS error <= 2e-2): a failing row prints FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

import flashscan
from flashscan import distributed as fsd

TOL = 2e-2


DEV = "cuda"  # "cpu" with --cpu-smoke (gloo, float32 through the references: a dry run)


def timed(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Median seconds of fn, the slowest rank's, each iteration after a barrier."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        if DEV == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    t = torch.tensor([statistics.median(times)], device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def rel_rms(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="32768,65536,131072")
    ap.add_argument("--nheads", type=int, default=16)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo on CPU, tiny: a dry run")
    args = ap.parse_args()

    global DEV
    dtype = torch.bfloat16
    if args.cpu_smoke:
        DEV, dtype = "cpu", torch.float32
        dist.init_process_group("gloo")
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    h, d = args.nheads, args.headdim
    rows = []
    for S in (int(s) for s in args.seqlens.split(",")):
        g = torch.Generator(device=DEV).manual_seed(S)
        full = [
            torch.randn(1, S, h, d, device=DEV, generator=g).to(dtype) for _ in range(4)
        ]  # q, k, v, dout: the same on every rank (same seed)
        for causal in (False, True):
            row = measure(full, causal, rank, world, args.iters, not args.no_backward)
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    if rank == 0:
        name = "cpu" if DEV == "cpu" else torch.cuda.get_device_name()
        print_table(rows, world, name)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            meta = {
                "device": name,
                "world": world,
                "nheads": h,
                "headdim": d,
                "commit": os.environ.get("FLASHSCAN_COMMIT", "unknown"),
            }
            (out / "ring.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    dist.destroy_process_group()


def measure(
    full: list[torch.Tensor], causal: bool, rank: int, world: int, iters: int, backward: bool
) -> dict:
    """One row: the guard, then ring / single / all-gather forward times (and training)."""
    _, S, h, d = full[0].shape
    n = S // world
    layout = "zigzag" if causal else "contiguous"
    cut = fsd.zigzag_shard if causal else fsd.shard
    ql, kl, vl, dl = (cut(t, rank, world).contiguous() for t in full)
    qc, kc, vc = (fsd.shard(t, rank, world).contiguous() for t in full[:3])

    def ring_fwd() -> torch.Tensor:
        return fsd.ring_flash_attn_func(ql, kl, vl, causal=causal, layout=layout)

    def single_fwd() -> torch.Tensor:
        return flashscan.flash_attn_func(*full[:3], causal=causal)

    def allgather_fwd() -> torch.Tensor:
        # gathered along dim 0 (what every backend accepts): (world * batch, n, h, d)
        ks = torch.empty(world * kc.shape[0], *kc.shape[1:], device=DEV, dtype=kc.dtype)
        vs = torch.empty_like(ks)
        dist.all_gather_into_tensor(ks, kc)
        dist.all_gather_into_tensor(vs, vc)
        kall = ks.view(world, 1, n, h, d).transpose(0, 1).reshape(1, S, h, d)
        vall = vs.view(world, 1, n, h, d).transpose(0, 1).reshape(1, S, h, d)
        seen = (rank + 1) * n if causal else S  # causal: the prefix, bottom-right aligned
        return flashscan.flash_attn_func(qc, kall[:, :seen], vall[:, :seen], causal=causal)

    # the guard: the ring's rows against the all-gather path's (contiguous rows)
    ring_out = ring_fwd()
    gathered = [torch.empty_like(ring_out) for _ in range(world)]
    dist.all_gather(gathered, ring_out.contiguous())
    whole = (fsd.zigzag_unshard if causal else fsd.unshard)(gathered)
    e = torch.tensor([rel_rms(fsd.shard(whole, rank, world), allgather_fwd())], device=DEV)
    dist.all_reduce(e, op=dist.ReduceOp.MAX)
    row: dict = {"seqlen": S, "causal": causal, "layout": layout, "rel_rms": float(e.item())}
    if not float(e.item()) <= TOL:
        row["status"] = "FAIL"
        return row
    row["status"] = "ok"
    flops = 4 * h * S * S * d * (0.5 if causal else 1.0)
    t_ring, t_single, t_ag = (timed(f, iters) for f in (ring_fwd, single_fwd, allgather_fwd))
    row.update(
        fwd_ring_ms=t_ring * 1e3,
        fwd_single_ms=t_single * 1e3,
        fwd_allgather_ms=t_ag * 1e3,
        fwd_ring_tflops_per_gpu=flops / world / t_ring * 1e-12,
        fwd_single_tflops=flops / t_single * 1e-12,
        fwd_allgather_tflops_per_gpu=flops / world / t_ag * 1e-12,
        fwd_efficiency=t_single / (world * t_ring),
    )
    if backward:
        qg, kg, vg = (t.detach().requires_grad_() for t in (ql, kl, vl))
        fq, fk, fv = (t.detach().requires_grad_() for t in full[:3])

        def ring_train() -> None:
            fsd.ring_flash_attn_func(qg, kg, vg, causal=causal, layout=layout).backward(dl)

        def single_train() -> None:
            flashscan.flash_attn_func(fq, fk, fv, causal=causal).backward(full[3])

        t_rt, t_st = timed(ring_train, iters), timed(single_train, iters)
        row.update(
            train_ring_ms=t_rt * 1e3,
            train_single_ms=t_st * 1e3,
            train_ring_tflops_per_gpu=3.5 * flops / world / t_rt * 1e-12,
            train_efficiency=t_st / (world * t_rt),
        )
    return row


def print_table(rows: list[dict], world: int, device: str) -> None:
    print(f"\nring attention, {world} x {device} (TFLOP/s per GPU; eff = single / (W * ring))")
    print(
        f"{'seqlen':>7} {'causal':>6} | {'ring':>6} {'single':>6} {'allgath':>7} {'eff':>5} |"
        f" {'train ring':>10} {'eff':>5}"
    )
    for r in rows:
        if "fwd_ring_ms" not in r:
            print(f"{r['seqlen']:>7} {r['causal']!s:>6} | FAIL (rel RMS {r['rel_rms']:.2e})")
            continue
        tr = r.get("train_ring_tflops_per_gpu", float("nan"))
        te = r.get("train_efficiency", float("nan"))
        print(
            f"{r['seqlen']:>7} {r['causal']!s:>6} | {r['fwd_ring_tflops_per_gpu']:6.0f}"
            f" {r['fwd_single_tflops']:6.0f} {r['fwd_allgather_tflops_per_gpu']:7.0f}"
            f" {r['fwd_efficiency']:5.2f} | {tr:10.0f} {te:5.2f}"
        )


if __name__ == "__main__":
    main()
