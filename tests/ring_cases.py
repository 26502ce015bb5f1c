"""The cases of flashscan.distributed, run on every rank of an initialised process group: ring
attention (forward and backward, contiguous and zig-zag, causal or not, GQA, softcap) and the
sharded selective scan (forward and backward, initial state, last state) against the same op
over the whole, unsharded sequence.

CPU (gloo, spawned by tests/test_distributed.py): float64 tensors through the float64
references, where the ring must agree with the unsharded call to ~1e-10, and float32 tensors
within 1e-4 relative of the float64 result.

GPU (NCCL, one GPU per rank; `torchrun --nproc-per-node 2 tests/ring_cases.py`): bfloat16 under
the correctness rule: the ring's max error against a float64 reference at most 2x that of
flashscan's single-GPU bfloat16 call over the whole sequence, plus a small slack.

Every rank draws the full tensors from one seed, runs its shard, and checks its own rows (and
the all-reduced parameter gradients): a failing rank raises, which fails the run.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import flashscan.torch as fst
from flashscan import distributed as fsd


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got.double() - ref.double()).abs().max().item()


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return _err(got, ref) / max(ref.double().abs().max().item(), 1e-30)


def _check(
    name: str, got: torch.Tensor, ref: torch.Tensor, tol: float, base: torch.Tensor | None = None
) -> None:
    """got vs ref: relative error <= tol, or (with a same-precision baseline) max error <=
    2 * the baseline's + tol * max|ref|."""
    if not torch.isfinite(got).all():
        raise AssertionError(f"{name}: non-finite values")
    e = _err(got, ref)
    if base is None:
        bound = tol * max(ref.double().abs().max().item(), 1e-30)
    else:
        bound = 2 * _err(base, ref) + tol * ref.double().abs().max().item()
    if not e <= bound:
        raise AssertionError(f"{name}: max error {e:.3e} > bound {bound:.3e}")


def attention_case(
    rank: int,
    world: int,
    device: str,
    dtype: torch.dtype,
    *,
    causal: bool,
    layout: str,
    batch: int = 2,
    seqlen: int = 48,
    nheads: int = 4,
    nheads_k: int = 2,
    headdim: int = 16,
    softcap: float = 0.0,
    window: tuple[int, int] = (-1, -1),
    seed: int = 0,
) -> None:
    """Ring attention's out, lse, dq, dk, dv on this rank's rows == the unsharded op's."""
    g = torch.Generator().manual_seed(seed)
    shape_q = (batch, seqlen, nheads, headdim)
    shape_k = (batch, seqlen, nheads_k, headdim)
    q64, k64, v64, do64 = (
        torch.randn(s, generator=g, dtype=torch.float64)
        for s in (shape_q, shape_k, shape_k, shape_q)
    )
    cut = fsd.zigzag_shard if layout == "zigzag" else fsd.shard

    def local(t: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return cut(t, rank, world).to(device=device, dtype=dt).contiguous().requires_grad_()

    # the float64 reference over the whole sequence (the NumPy float64 path)
    full = [t.clone().requires_grad_() for t in (q64, k64, v64)]
    o_ref, lse_ref = fst.flash_attn_func(
        *full, causal=causal, softcap=softcap, window_size=window, return_lse=True
    )
    o_ref.backward(do64)
    refs = {
        "out": o_ref,
        "lse": lse_ref,
        "dq": full[0].grad,
        "dk": full[1].grad,
        "dv": full[2].grad,
    }

    def run(
        fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        o, lse = fn(q, k, v, causal=causal, softcap=softcap, window_size=window, return_lse=True)
        o.backward(do)
        return {"out": o, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}

    q, k, v = (local(t, dtype) for t in (q64, k64, v64))
    ring = functools.partial(fsd.ring_flash_attn_func, layout=layout)
    got = run(ring, q, k, v, cut(do64, rank, world).to(device, dtype))
    base = None
    if dtype in (torch.float16, torch.bfloat16):
        # the same-precision baseline: flashscan's own single-device call on the whole sequence
        whole = [t.to(device=device, dtype=dtype).requires_grad_() for t in (q64, k64, v64)]
        b = run(fst.flash_attn_func, *whole, do64.to(device, dtype))
        base = {n: cut(t.detach(), rank, world, dim=2 if n == "lse" else 1) for n, t in b.items()}
    tol = {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 2e-3)
    what = f"world={world} {layout} causal={causal} {dtype} softcap={softcap} window={window}"
    for n, t in got.items():
        ref = cut(refs[n].detach(), rank, world, dim=2 if n == "lse" else 1)
        _check(f"{what} {n}", t.detach().cpu(), ref, tol, None if base is None else base[n].cpu())


def scan_case(
    rank: int,
    world: int,
    device: str,
    dtype: torch.dtype,
    *,
    batch: int = 2,
    dim: int = 6,
    dstate: int = 5,
    seqlen: int = 24,
    with_initial: bool = True,
    method: str = "serial",
    seed: int = 1,
) -> None:
    """The sharded scan's out, last state and gradients == the unsharded scan's."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*s: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*s, generator=g, dtype=torch.float64) * scale

    u, z, dout = rnd(batch, dim, seqlen), rnd(batch, dim, seqlen), rnd(batch, dim, seqlen)
    delta = rnd(batch, dim, seqlen, scale=0.5)
    A = -torch.rand(dim, dstate, generator=g, dtype=torch.float64) - 0.5
    B, C = rnd(batch, dstate, seqlen), rnd(batch, dstate, seqlen)
    D, delta_bias = rnd(dim), rnd(dim, scale=0.1)
    h0 = rnd(batch, dim, dstate) if with_initial else None
    dlast = rnd(batch, dim, dstate)
    seq = (u, delta, B, C, z)
    params = (A, D, delta_bias)

    def scan(
        fn: Callable[..., Any],
        s: tuple[torch.Tensor, ...],
        p: tuple[torch.Tensor, ...],
        h: torch.Tensor | None,
        **kw: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        uu, dd, bb, cc, zz = s
        aa, dD, db = p
        return fn(
            uu,
            dd,
            aa,
            bb,
            cc,
            dD,
            zz,
            db,
            delta_softplus=True,
            return_last_state=True,
            initial_state=h,
            **kw,
        )

    # the reference: the whole sequence, float64
    s_full = [t.clone().requires_grad_() for t in seq]
    p_full = [t.clone().requires_grad_() for t in params]
    h_full = None if h0 is None else h0.clone().requires_grad_()
    out_ref, last_ref = scan(fst.selective_scan_fn, s_full, p_full, h_full)
    (out_ref * dout).sum().add_((last_ref * dlast).sum()).backward()

    # u, delta, z in `dtype`; B, C, the parameters and the state in float32 (float64 with
    # float64 inputs), as selective_scan_fn takes them
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    dts = (dtype, dtype, pdt, pdt, dtype)
    names = ("u", "delta", "B", "C", "z", "A", "D", "delta_bias")

    def local(t: torch.Tensor) -> torch.Tensor:
        return fsd.shard(t, rank, world, dim=-1)

    def results(sharded: bool) -> dict[str, torch.Tensor]:
        """out, last state and gradients of the sharded scan (this rank's share) or of
        flashscan's unsharded scan on this device in the same precision (the baseline)."""
        cut = local if sharded else (lambda t: t)
        s = [cut(t).to(device, dt).contiguous().requires_grad_() for t, dt in zip(seq, dts)]
        p = [t.to(device, pdt).requires_grad_() for t in params]
        h = None if h0 is None else h0.to(device, pdt).requires_grad_()
        if sharded:
            out, last = scan(fsd.sharded_selective_scan, s, p, h, method=method)
        else:
            out, last = scan(fst.selective_scan_fn, s, p, h)
        loss = (out * cut(dout).to(device, dtype)).sum()
        if not sharded or rank == world - 1:  # only the true final state is used
            loss = loss + (last * dlast.to(device, pdt)).sum()
        loss.backward()
        res = {"out": out.detach(), "last_state": last.detach()}
        res.update({f"d{n}": t.grad for n, t in zip(names, s + p)})
        if h is not None and (not sharded or rank == 0):  # other ranks ignore initial_state
            res["dinitial_state"] = h.grad
        if sharded:
            for n in ("dA", "dD", "ddelta_bias"):
                dist.all_reduce(res[n])  # each rank holds its shard's share
        return {n: t.cpu() for n, t in res.items()}

    got = results(True)
    base = results(False) if dtype in (torch.float16, torch.bfloat16) else None
    refs = {"out": out_ref.detach(), "last_state": last_ref.detach()}
    refs.update({f"d{n}": t.grad for n, t in zip(names, s_full + p_full)})
    if h_full is not None:
        refs["dinitial_state"] = h_full.grad
    per_step = {"out", "du", "ddelta", "dB", "dC", "dz"}
    tol = {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 1e-3)
    for n, t in got.items():
        if n == "last_state" and rank != world - 1:
            continue  # the state after this shard only: checked on the last rank
        if n == "dinitial_state" and rank != 0:
            continue  # only rank 0 takes the initial state
        ref = local(refs[n]) if n in per_step else refs[n]
        b = None if base is None else (local(base[n]) if n in per_step else base[n])
        _check(f"scan {method} world={world} {dtype} {n}", t, ref, tol, b)


def run_all(rank: int, world: int, device: str, dtypes: tuple[torch.dtype, ...]) -> None:
    """Every case, in one process group (spawning is the slow part on CPU)."""
    for dtype in dtypes:
        for causal, layout in ((False, "contiguous"), (True, "contiguous"), (True, "zigzag")):
            attention_case(rank, world, device, dtype, causal=causal, layout=layout)
        # sliding windows across shard boundaries (48 rows: shards of 24 or 12, chunks of 6+)
        for causal, layout, window in (
            (True, "contiguous", (5, 0)),
            (True, "zigzag", (13, 0)),
            (False, "zigzag", (7, 3)),
            (False, "contiguous", (-1, 0)),
            (False, "contiguous", (0, 9)),
        ):
            attention_case(
                rank, world, device, dtype, causal=causal, layout=layout, window=window, seed=11
            )
        attention_case(
            rank,
            world,
            device,
            dtype,
            causal=True,
            layout="zigzag",
            softcap=5.0,
            nheads_k=4,
            seed=3,
        )
        scan_case(rank, world, device, dtype)
        scan_case(rank, world, device, dtype, with_initial=False, seed=2)
        scan_case(rank, world, device, dtype, method="parallel")
        scan_case(rank, world, device, dtype, method="parallel", with_initial=False, seed=4)


def spawned(rank: int, world: int, init_file: str, dtypes: tuple[torch.dtype, ...]) -> None:
    """torch.multiprocessing.spawn's entry (CPU, gloo)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        run_all(rank, world, "cpu", dtypes)
    finally:
        dist.destroy_process_group()


def main() -> int:
    """torchrun's entry: NCCL, one GPU per rank, bfloat16 (and float32)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    # --quick: bfloat16 only, no long case (what runs under compute-sanitizer)
    quick = "--quick" in sys.argv[1:]
    try:
        run_all(
            rank,
            world,
            f"cuda:{local}",
            (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32),
        )
        # a longer sequence, hd128, through the real kernel tiles
        for causal, layout in () if quick else ((False, "contiguous"), (True, "zigzag")):
            attention_case(
                rank,
                world,
                f"cuda:{local}",
                torch.bfloat16,
                causal=causal,
                layout=layout,
                batch=1,
                seqlen=2048,
                nheads=8,
                nheads_k=8,
                headdim=128,
                seed=7,
            )
        dist.barrier()
        if rank == 0:
            print(f"ring_cases: all cases passed on {world} ranks")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
