"""Peer-comparison benchmark: flashscan against every peer present, in one run, on the GPU here.

    python benches/compare.py [--quick] [--suite attention,latency,scan,state_update|all|none]
                              [--out DIR] [--cold-start] [--no-plots] [--seed N]
    (`python -m flashscan bench` takes the same arguments.)

What one run does:

1. Measures two ceilings of this GPU: device copy bandwidth (a 1 GiB device-to-device copy,
   512 MiB with --quick; bytes read + bytes written) and bf16 matmul rate (torch.mm of large
   squares, 2*m^3 FLOPs), plus, when Triton is importable, the exp2 rate of the special-function
   units (a Triton kernel of independent ex2.approx chains), because the selective scan computes
   one exponential per (batch, channel, step, state) and can be bound by them.
2. Runs the suites. Every row gets its floor: max(FLOPs / matmul rate, bytes / copy bandwidth,
   exponentials / exp2 rate), and the ratio measured time / floor.
3. Times flashscan and the peers on the same random inputs (never zeros), rotating among several
   input sets when one set would fit in L2; GPU time is the median of per-call CUDA-event
   timings with L2 flushed before each call (triton.testing.do_bench with return_mode="median"
   when Triton is importable, the same method with torch events otherwise). Latency rows add
   wall time per call from Python (back-to-back calls, then one synchronize), wall time of one
   call followed by a synchronize, and CUDA-graph replays.
4. Guards correctness: before a row is timed, its output is compared with a float64 torch
   reference on a subset (rows of queries, channels of the scan) and the row is marked FAILED
   when it is off by more than a loose tolerance: a fast wrong kernel must not look good.
5. Writes `<out>/results.md` (also printed), `<out>/results.json` (raw numbers) and PNG plots
   when matplotlib is importable.

Peers: torch SDPA per backend (flash, cuDNN, efficient, math where the score matrix is small),
flash-attn (2 and 3) and mamba_ssm when importable, a plain torch selective scan (a sequential
loop: only at short seqlen), a plain torch state update, and the NumPy reference at tiny shapes.
mamba_ssm anchors measured on the same H100 model are shown beside our rows, labelled as not
measured in this run.

This module imports only the standard library at import time: torch, triton and matplotlib
are imported when a run needs them, so a machine without them gets a message, not a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import importlib
import importlib.util
import itertools
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["main", "torch_selective_scan", "torch_state_update"]

SUITES = ("attention", "latency", "scan", "state_update")
ANCHOR_LABEL = "anchor (issue 4, 2026-11-22)"
L2_DEFAULT_BYTES = 50 * 2**20
_ESIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# Loose guard tolerances on the relative RMS error against the float64 reference: wide enough
# for any correct kernel of that precision, far below what a wrong one produces.
_GUARD_RMS = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 5e-3}
_SCAN_KEYS = ("u", "delta", "A", "B", "C", "D", "z")
_STATE_KEYS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")

# mamba_ssm measured on the project's H100 on 2026-11-22 (issue 4); not measured in a run.
# (suite, shape key, seconds, which column it belongs to, what was measured)
_ANCHORS: tuple[tuple[str, tuple[Any, ...], float, str, str], ...] = (
    ("scan", (32, 512, 60, 16, "bf16"), 86e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (32, 512, 60, 16, "fp32"), 86e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (1, 512, 60, 16, "bf16"), 20e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (1, 512, 60, 16, "fp32"), 20e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (8, 2048, 2048, 16, "bf16"), 594e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (8, 2048, 8192, 16, "bf16"), 2.80e-3, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (2, 5120, 16384, 16, "bf16"), 3.70e-3, "gpu", "mamba_ssm CUDA kernel, fwd"),
    (
        "state_update",
        (32, 512, 16, "bf16"),
        110e-6,
        "wall",
        "mamba_ssm Triton selective_state_update, per call from Python",
    ),
    (
        "state_update",
        (64, 5120, 16, "bf16"),
        123e-6,
        "wall",
        "mamba_ssm Triton selective_state_update, per call from Python",
    ),
)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanShape:
    batch: int
    dim: int
    seqlen: int
    dstate: int
    dtype: str


@dataclass(frozen=True)
class StateShape:
    batch: int
    dim: int
    dstate: int
    dtype: str


@dataclass
class Config:
    """Shapes and timing budgets of a run (`make_config`)."""

    quick: bool
    attn_head_dims: tuple[int, ...]
    attn_seqlens: tuple[int, ...]
    attn_tokens: int = 16384  # batch * seqlen
    attn_width: int = 2048  # nheads * headdim
    attn_dtype: str = "bf16"
    attn_math_max_scores: int = 2**28  # b*h*sq*sk above which SDPA's MATH backend is skipped
    latency_batches: tuple[int, ...] = (1, 32)
    latency_seqlen: int = 60
    latency_heads: int = 8
    latency_headdim: int = 64
    latency_dtypes: tuple[str, ...] = ("bf16",)
    scan_shapes: tuple[ScanShape, ...] = ()
    state_shapes: tuple[StateShape, ...] = ()
    # timing
    warmup_ms: int = 25
    rep_ms: int = 100
    wall_calls: int = 1000  # calls per back-to-back wall sample (fewer for slow calls)
    wall_repeats: int = 7
    sync_calls: int = 500  # samples of one call + synchronize
    wall_budget_s: float = 1.0  # rough cap on the wall-clock spent per wall measurement
    graph_sets: int = 4  # graphs captured per row (one call each, rotated)
    max_sets: int = 64  # input sets rotated at most
    # ceilings
    copy_bytes: int = 2**30
    matmul_sizes: tuple[int, ...] = (8192, 16384)
    exp_iters: int = 256
    # correctness guard and the slow peers
    guard_rows: int = 64  # query rows checked per (batch, head)
    guard_channels: int = 256  # scan channels checked
    torch_loop_max_seqlen: int = 256  # the plain torch sequential scan only up to this seqlen
    numpy_max_attn: int = 2**26  # b*h*sq*sk*d for the NumPy reference
    numpy_max_scan: int = 2**24  # b*dim*seqlen*dstate
    numpy_max_state: int = 2**20  # b*dim*dstate


def make_config(quick: bool) -> Config:
    game = (32, 512, 60, 16)
    if quick:
        return Config(
            quick=True,
            attn_head_dims=(64, 128),
            attn_seqlens=(512, 2048, 16384),
            latency_dtypes=("bf16",),
            scan_shapes=(
                ScanShape(*game, "bf16"),
                ScanShape(*game, "fp32"),
                ScanShape(1, 512, 60, 16, "bf16"),
                ScanShape(8, 2048, 2048, 16, "bf16"),
                ScanShape(2, 5120, 16384, 16, "bf16"),
            ),
            state_shapes=(StateShape(32, 512, 16, "bf16"), StateShape(64, 5120, 16, "bf16")),
            warmup_ms=10,
            rep_ms=40,
            wall_calls=200,
            wall_repeats=5,
            sync_calls=200,
            wall_budget_s=0.3,
            graph_sets=2,
            copy_bytes=2**29,
            matmul_sizes=(8192,),
            exp_iters=128,
        )
    return Config(
        quick=False,
        attn_head_dims=(64, 128, 256),
        attn_seqlens=(512, 1024, 2048, 4096, 8192, 16384),
        latency_dtypes=("bf16", "fp32"),
        scan_shapes=(
            ScanShape(*game, "bf16"),
            ScanShape(*game, "fp32"),
            ScanShape(1, 512, 60, 16, "bf16"),
            ScanShape(1, 512, 60, 16, "fp32"),
            ScanShape(8, 2048, 2048, 16, "bf16"),
            ScanShape(8, 2048, 8192, 16, "bf16"),
            ScanShape(2, 5120, 16384, 16, "bf16"),
        ),
        state_shapes=(
            StateShape(32, 512, 16, "bf16"),
            StateShape(32, 512, 16, "fp32"),
            StateShape(64, 5120, 16, "bf16"),
        ),
    )


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class Ceilings:
    copy_bw: float | None = None  # bytes / s (read + written)
    matmul_rate: float | None = None  # FLOP / s, bf16
    exp_rate: float | None = None  # exp2 / s
    notes: dict[str, str] = field(default_factory=dict)


@dataclass
class Row:
    """One measurement: an implementation at a shape. Times in seconds, per call."""

    suite: str
    shape: str
    params: dict[str, Any]
    impl: str
    kind: str  # "flashscan", "peer" or "anchor"
    status: str = "ok"  # ok, FAILED, error, n/a, skipped, unavailable, anchor
    note: str = ""
    gpu_s: float | None = None  # GPU time (CUDA events, L2 flushed), median
    wall_s: float | None = None  # wall per call from Python, back-to-back, one final sync
    sync_s: float | None = None  # wall of one call + synchronize, median
    graph_s: float | None = None  # GPU time of one CUDA-graph replay, median
    graph_wall_s: float | None = None  # wall per replay from Python, back-to-back
    cpu_s: float | None = None  # host wall time (NumPy reference)
    first_call_s: float | None = None  # first call in this process (compile / load included)
    flops: float = 0.0
    bytes: float = 0.0
    exps: float = 0.0
    floor_s: float | None = None
    floor_bound: str = ""
    floors: dict[str, float] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)

    @property
    def main_s(self) -> float | None:
        """The time this row is compared by: GPU time, else host time, else wall time."""
        for t in (self.gpu_s, self.cpu_s, self.wall_s):
            if t is not None:
                return t
        return None


def _floors(ceil: Ceilings, flops: float, nbytes: float, exps: float) -> dict[str, float]:
    out: dict[str, float] = {}
    if flops and ceil.matmul_rate:
        out["matmul"] = flops / ceil.matmul_rate
    if nbytes and ceil.copy_bw:
        out["memory"] = nbytes / ceil.copy_bw
    if exps and ceil.exp_rate:
        out["exp"] = exps / ceil.exp_rate
    return out


def attention_cost(
    b: int, sq: int, sk: int, h: int, hk: int, d: int, dtype: str, causal: bool
) -> tuple[float, float]:
    """(FLOPs, bytes) of an attention forward: FLOPs = 4*b*h*sq*sk*d (QK^T and PV), halved
    when causal; bytes = q, k, v read once + out written once."""
    flops = 4.0 * b * h * sq * sk * d
    if causal:
        flops /= 2
    nbytes = float(_ESIZE[dtype]) * (2 * b * sq * h * d + 2 * b * sk * hk * d)
    return flops, nbytes


def scan_cost(s: ScanShape, has_z: bool = True, has_d: bool = True) -> tuple[float, float]:
    """(bytes, exponentials) of a selective scan with varying B, C (batch, dstate, seqlen) in
    u's dtype: u, delta (and z) read + out written, B and C read, A (fp32) and D (fp32) read;
    one exp(dt * A) per (batch, channel, step, state)."""
    e = _ESIZE[s.dtype]
    per_seq = s.batch * s.dim * s.seqlen
    nbytes = per_seq * e * (3 + (1 if has_z else 0))
    nbytes += 2 * s.batch * s.dstate * s.seqlen * e
    nbytes += s.dim * s.dstate * 4 + (s.dim * 4 if has_d else 0)
    return float(nbytes), float(per_seq * s.dstate)


def state_update_cost(s: StateShape) -> tuple[float, float]:
    """(bytes, exponentials) of one decode step: the fp32 state read and written, x, dt, z read
    and out written, B and C read, A, D and dt_bias (fp32) read; one exp per state element."""
    e = _ESIZE[s.dtype]
    nbytes = 2 * s.batch * s.dim * s.dstate * 4
    nbytes += 4 * s.batch * s.dim * e + 2 * s.batch * s.dstate * e
    nbytes += s.dim * s.dstate * 4 + 2 * s.dim * 4
    return float(nbytes), float(s.batch * s.dim * s.dstate)


# ---------------------------------------------------------------------------------------------
# Torch references (float64 for the guard; float32 as the "plain torch" peer)
# ---------------------------------------------------------------------------------------------


def _bc_time_major(torch: Any, m: Any, dim: int, acc: Any) -> Any:
    """B or C -> broadcastable against (seqlen, batch, dim, dstate)."""
    if m.dim() == 2:  # (dim, dstate), fixed over time
        return m.to(acc)[None, None]
    if m.dim() == 3:  # (batch, dstate, seqlen)
        return m.to(acc).permute(2, 0, 1)[:, :, None, :]
    g = m.shape[1]  # (batch, ngroups, dstate, seqlen): channel c uses group c // (dim // g)
    return m.to(acc).repeat_interleave(dim // g, dim=1).permute(3, 0, 1, 2)


def torch_selective_scan(
    torch: Any,
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    initial_state: Any = None,
    acc: Any = None,
) -> tuple[Any, Any]:
    """mamba_ssm's selective scan in plain torch, sequential over time (one addcmul per step,
    everything else vectorised). Returns (out (batch, dim, seqlen) in `acc`, last state)."""
    acc = torch.float32 if acc is None else acc
    F = torch.nn.functional
    batch, dim, seqlen = u.shape
    uf = u.to(acc)
    dt = delta.to(acc)
    if delta_bias is not None:
        dt = dt + delta_bias.to(acc)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    dt_t = dt.permute(2, 0, 1)[..., None]  # (seqlen, batch, dim, 1)
    d_a = torch.exp(dt_t * A.to(acc))  # (seqlen, batch, dim, dstate)
    d_bu = (dt_t * uf.permute(2, 0, 1)[..., None]) * _bc_time_major(torch, B, dim, acc)
    d_bu = d_bu.expand_as(d_a).contiguous()
    xs = torch.empty_like(d_a)
    if initial_state is not None:
        prev = initial_state.to(acc)
    else:
        prev = torch.zeros(d_a.shape[1:], dtype=acc, device=u.device)
    for t in range(seqlen):
        torch.addcmul(d_bu[t], d_a[t], prev, out=xs[t])
        prev = xs[t]
    y = (xs * _bc_time_major(torch, C, dim, acc)).sum(-1).permute(1, 2, 0)  # (batch, dim, L)
    if D is not None:
        y = y + D.to(acc)[:, None] * uf
    if z is not None:
        y = y * F.silu(z.to(acc))
    return y, prev


def torch_state_update(
    torch: Any,
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    acc: Any = None,
    inplace: bool = False,
) -> tuple[Any, Any]:
    """mamba_ssm's selective_state_update for state (batch, dim, dstate), B, C
    (batch, dstate), in plain torch. Returns (out in `acc`, new state); with inplace=True the
    new state is also copied into `state`."""
    acc = torch.float32 if acc is None else acc
    F = torch.nn.functional
    xf = x.to(acc)
    dtf = dt.to(acc)
    if dt_bias is not None:
        dtf = dtf + dt_bias.to(acc)
    if dt_softplus:
        dtf = F.softplus(dtf)
    d_a = torch.exp(dtf[..., None] * A.to(acc))  # (batch, dim, dstate)
    d_bx = (dtf * xf)[..., None] * B.to(acc)[:, None, :]
    new = state.to(acc) * d_a + d_bx
    out = (new * C.to(acc)[:, None, :]).sum(-1)
    if D is not None:
        out = out + D.to(acc) * xf
    if z is not None:
        out = out * F.silu(z.to(acc))
    if inplace:
        state.copy_(new)
    return out, new


def attention_rows_reference(
    torch: Any, q: Any, k: Any, v: Any, causal: bool, bidx: list[int], rows: Any
) -> Any:
    """float64 attention output at query rows `rows` of batches `bidx`: (nb, nrows, h, d).
    Causal masks are aligned bottom-right (flash-attn >= 2.1)."""
    qs = q[bidx][:, rows].double()
    ks = k[bidx].double()
    vs = v[bidx].double()
    h, hk, d = q.shape[2], k.shape[2], q.shape[3]
    if hk != h:
        ks = ks.repeat_interleave(h // hk, dim=2)
        vs = vs.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("brhd,bshd->bhrs", qs, ks) * (1.0 / math.sqrt(d))
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        cols = torch.arange(sk, device=scores.device)
        mask = cols[None, :] > (rows.to(scores.device)[:, None] + (sk - sq))
        scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("bhrs,bshd->brhd", p, vs)


def _compare(torch: Any, got: Any, ref: Any, tol_rms: float) -> tuple[bool, dict[str, Any]]:
    """Loose guard: relative RMS error <= tol_rms and max error <= 5 * tol_rms * max|ref|."""
    got = got.double()
    ref = ref.double()
    finite = bool(torch.isfinite(got).all())
    diff = (got - ref).abs()
    ref_norm = float(ref.norm())
    rel_rms = float((got - ref).norm()) / max(ref_norm, 1e-30) if finite else math.inf
    max_err = float(diff.max()) if finite and diff.numel() else (0.0 if finite else math.inf)
    ref_max = float(ref.abs().max()) if ref.numel() else 0.0
    ok = finite and rel_rms <= tol_rms and max_err <= 5 * tol_rms * ref_max + 1e-6
    return ok, {
        "finite": finite,
        "rel_rms_err": rel_rms,
        "max_abs_err": max_err,
        "ref_max_abs": ref_max,
        "tol_rel_rms": tol_rms,
        "elements": int(ref.numel()),
    }


def _as_torch(torch: Any, x: Any, device: Any) -> Any:
    if isinstance(x, (tuple, list)):
        x = x[0]
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    return x.to(device)


class _AttnGuard:
    """Query rows spread over the sequence (first and last included), batches first and last."""

    def __init__(self, rn: Runner, st: dict[str, Any], causal: bool, dtype: str) -> None:
        torch = rn.torch
        q = st["q"]
        b, sq = q.shape[0], q.shape[1]
        self.torch, self.device = torch, rn.device
        self.bidx = [0] if b == 1 else [0, b - 1]
        nrows = min(sq, rn.cfg.guard_rows)
        self.rows = torch.linspace(0, sq - 1, nrows, device=rn.device).round().long().unique()
        self.ref = attention_rows_reference(
            torch, q, st["k"], st["v"], causal, self.bidx, self.rows
        )
        self.tol = _GUARD_RMS[dtype]

    def prepare(self, st: dict[str, Any]) -> dict[str, Any]:
        return st

    def check(self, out: Any, st: dict[str, Any], host: bool) -> tuple[bool, dict[str, Any]]:
        o = _as_torch(self.torch, out, self.device)
        finite_all = bool(self.torch.isfinite(o).all())
        ok, m = _compare(self.torch, o[self.bidx][:, self.rows.to(o.device)], self.ref, self.tol)
        m["finite_all"] = finite_all
        return ok and finite_all, m


class _ScanGuard:
    """All of a small problem; else first and last batch and `guard_channels` random channels."""

    def __init__(self, rn: Runner, st: dict[str, Any], dtype: str) -> None:
        torch = rn.torch
        u = st["u"]
        b, dim, seqlen = u.shape
        n = st["A"].shape[1]
        self.torch, self.device = torch, rn.device
        small = b * dim * seqlen * n <= 2**24
        self.bidx = list(range(b)) if small else sorted({0, b - 1})
        if small or dim <= rn.cfg.guard_channels:
            self.cidx = torch.arange(dim, device=rn.device)
        else:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(1234)
            self.cidx = torch.randperm(dim, generator=gen)[: rn.cfg.guard_channels].sort().values
            self.cidx = self.cidx.to(rn.device)
        sub = self._subset(st)
        self.ref, _ = torch_selective_scan(torch, **sub, delta_softplus=True, acc=torch.float64)
        self.tol = _GUARD_RMS[dtype]

    def _subset(self, st: dict[str, Any]) -> dict[str, Any]:
        bi, ci = self.bidx, self.cidx

        def bc(m: Any) -> Any:
            if m.dim() == 2:
                return m[ci]
            if m.dim() == 3:
                return m[bi]
            return m[bi][:, ci // (st["u"].shape[1] // m.shape[1])]

        return {
            "u": st["u"][bi][:, ci],
            "delta": st["delta"][bi][:, ci],
            "A": st["A"][ci],
            "B": bc(st["B"]),
            "C": bc(st["C"]),
            "D": None if st.get("D") is None else st["D"][ci],
            "z": None if st.get("z") is None else st["z"][bi][:, ci],
        }

    def prepare(self, st: dict[str, Any]) -> dict[str, Any]:
        return st

    def check(self, out: Any, st: dict[str, Any], host: bool) -> tuple[bool, dict[str, Any]]:
        o = _as_torch(self.torch, out, self.device)
        finite_all = bool(self.torch.isfinite(o).all())
        ok, m = _compare(self.torch, o[self.bidx][:, self.cidx.to(o.device)], self.ref, self.tol)
        m["finite_all"] = finite_all
        return ok and finite_all, m


class _StateGuard:
    """out and the new state against float64; the state is restored before each guarded call."""

    def __init__(self, rn: Runner, st: dict[str, Any], dtype: str) -> None:
        torch = rn.torch
        self.torch, self.device = torch, rn.device
        self.state0 = st["state"].clone()
        args = {k: v for k, v in st.items() if k != "state"}
        self.ref_out, self.ref_state = torch_state_update(
            torch, self.state0, **args, dt_softplus=True, acc=torch.float64
        )
        self.tol = _GUARD_RMS[dtype]

    def prepare(self, st: dict[str, Any]) -> dict[str, Any]:
        c = dict(st)
        c["state"] = self.state0.clone()
        return c

    def check(self, out: Any, st: dict[str, Any], host: bool) -> tuple[bool, dict[str, Any]]:
        o = _as_torch(self.torch, out, self.device)
        ok, m = _compare(self.torch, o, self.ref_out, self.tol)
        if not host:  # the host reference updates its own NumPy copy of the state
            ok_s, ms = _compare(self.torch, st["state"], self.ref_state, _GUARD_RMS["fp32"])
            m["state"] = ms
            ok = ok and ok_s
        return ok, m


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


class Timer:
    """GPU time: median of per-call CUDA-event timings, L2 flushed before each call
    (triton.testing.do_bench(return_mode="median") when importable, else the same with torch
    events). Wall time: perf_counter around back-to-back calls closed by one synchronize."""

    def __init__(self, torch: Any, device: Any, cfg: Config) -> None:
        self.torch, self.device, self.cfg = torch, device, cfg
        self._do_bench: Callable[..., Any] | None = None
        self._flush: Any = None
        self.description = (
            "CUDA events (torch), median of per-call timings, 256 MB L2 flush before each call"
        )
        try:
            import inspect

            from triton.testing import do_bench

            if "return_mode" in inspect.signature(do_bench).parameters:
                import triton

                self._do_bench = do_bench
                self.description = (
                    f"triton.testing.do_bench (triton {getattr(triton, '__version__', '?')}, "
                    f"warmup {cfg.warmup_ms} ms, rep {cfg.rep_ms} ms, return_mode='median', "
                    f"L2 flushed before each call)"
                )
        except Exception:
            self._do_bench = None

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def gpu(self, fn: Callable[[], Any]) -> float:
        """Median GPU seconds per call of fn."""
        if self._do_bench is not None:
            ms = self._do_bench(
                fn, warmup=self.cfg.warmup_ms, rep=self.cfg.rep_ms, return_mode="median"
            )
            return float(ms) * 1e-3
        return self._events(fn)

    def _events(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        if self._flush is None:
            self._flush = torch.empty(256 * 2**20, dtype=torch.int8, device=self.device)
        flush = self._flush
        fn()
        self.sync()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            flush.zero_()
            fn()
        end.record()
        self.sync()
        est_ms = max(start.elapsed_time(end) / 5, 1e-3)
        n_warm = max(1, int(self.cfg.warmup_ms / est_ms))
        n_rep = max(5, min(20000, int(self.cfg.rep_ms / est_ms)))
        for _ in range(n_warm):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        self.sync()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e-3

    def _calls_for(self, fn: Callable[[], Any], cap: int, parts: int) -> int:
        """How many calls fit the wall budget (split in `parts` samples), from one timed call."""
        t0 = time.perf_counter()
        fn()
        self.sync()
        one = max(time.perf_counter() - t0, 1e-7)
        return max(10, min(cap, int(self.cfg.wall_budget_s / parts / one)))

    def wall(self, fn: Callable[[], Any]) -> float:
        """Median over samples of (wall of n back-to-back calls + one synchronize) / n."""
        for _ in range(20):
            fn()
        self.sync()
        n = self._calls_for(fn, self.cfg.wall_calls, self.cfg.wall_repeats)
        samples = []
        for _ in range(self.cfg.wall_repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            self.sync()
            samples.append((time.perf_counter() - t0) / n)
        return statistics.median(samples)

    def call_sync(self, fn: Callable[[], Any]) -> float:
        """Median wall of one call followed by a synchronize (what a frame-by-frame caller
        waits for its result)."""
        fn()
        self.sync()
        n = self._calls_for(fn, self.cfg.sync_calls, 1)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            self.sync()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    def host(self, fn: Callable[[], Any]) -> float:
        """Median wall seconds of a host (CPU) function."""
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        n = max(1, min(20, int(self.cfg.wall_budget_s / one)))
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)


def _rotate(fns: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that calls fns[0], fns[1], ... in turn (different input sets)."""
    if len(fns) == 1:
        return fns[0]
    it = itertools.cycle(fns)
    return lambda: next(it)()


_EXP2_SRC = """
import triton
import triton.language as tl


@triton.jit
def exp2_kernel(x_ptr, y_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    # four independent chains of exp2 per element keep the special-function units busy
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(x_ptr + offs)
    b = a + 0.25
    c = a + 0.5
    d = a + 0.75
    for _ in range(ITERS):
        a = tl.exp2(a * -0.5)
        b = tl.exp2(b * -0.5)
        c = tl.exp2(c * -0.5)
        d = tl.exp2(d * -0.5)
    tl.store(y_ptr + offs, a + b + c + d)
"""


def _exp2_rate(torch: Any, device: Any, timer: Timer, iters: int) -> tuple[float | None, str]:
    """exp2 per second of the whole GPU, from a Triton kernel (written to a temporary file:
    Triton reads a kernel's source from its module)."""
    try:
        import triton  # noqa: F401
    except Exception as exc:
        return None, f"triton not importable ({type(exc).__name__})"
    tmp = tempfile.mkdtemp(prefix="flashscan-bench-")
    try:
        path = os.path.join(tmp, "flashscan_bench_exp2.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_EXP2_SRC)
        spec = importlib.util.spec_from_file_location("flashscan_bench_exp2", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kernel = mod.exp2_kernel
        block = 1024
        n = 1 << 22
        x = torch.rand(n, device=device, dtype=torch.float32)
        y = torch.empty_like(x)
        grid = (n // block,)

        def launch() -> None:
            kernel[grid](x, y, ITERS=iters, BLOCK=block, num_warps=4)

        launch()
        timer.sync()
        if not bool(torch.isfinite(y).all()):
            return None, "exp2 micro-benchmark produced non-finite values"
        t = timer.gpu(launch)
        return 4.0 * n * iters / t, f"Triton kernel, {n} x {iters} x 4 dependent-chain exp2"
    except Exception as exc:
        return None, f"exp2 micro-benchmark failed ({type(exc).__name__}: {_first_line(exc)})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_ceilings(
    torch: Any, device: Any, timer: Timer, cfg: Config, log: Callable[[str], None]
) -> Ceilings:
    ceil = Ceilings()
    try:
        n = cfg.copy_bytes // 4
        src = torch.empty(n, dtype=torch.float32, device=device).uniform_(-1.0, 1.0)
        dst = torch.empty_like(src)
        t = timer.gpu(_copy_call(dst, src))
        ceil.copy_bw = 2.0 * n * 4 / t
        ceil.notes["copy_bw"] = f"D2D copy of {n * 4 / 2**20:.0f} MiB, bytes read + written"
        del src, dst
        log(f"ceiling: device copy {ceil.copy_bw / 1e12:.2f} TB/s")
    except Exception as exc:
        ceil.notes["copy_bw"] = f"failed: {type(exc).__name__}: {_first_line(exc)}"
        log(f"ceiling: device copy failed ({_first_line(exc)})")
    best = 0.0
    for m in cfg.matmul_sizes:
        try:
            a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
            b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
            c = torch.empty(m, m, device=device, dtype=torch.bfloat16)
            t = timer.gpu(_mm_call(torch, a, b, c))
            rate = 2.0 * m**3 / t
            log(f"ceiling: bf16 matmul {m}^3 {rate / 1e12:.0f} TFLOP/s")
            best = max(best, rate)
            del a, b, c
        except Exception as exc:
            log(f"ceiling: bf16 matmul {m}^3 failed ({_first_line(exc)})")
    if best:
        ceil.matmul_rate = best
        sizes = ", ".join(f"{m}^3" for m in cfg.matmul_sizes)
        ceil.notes["matmul_rate"] = f"torch.mm bf16, best of {sizes}"
    ceil.exp_rate, ceil.notes["exp_rate"] = _exp2_rate(torch, device, timer, cfg.exp_iters)
    if ceil.exp_rate:
        log(f"ceiling: exp2 {ceil.exp_rate / 1e12:.2f} T/s")
    else:
        log(f"ceiling: exp2 rate not measured ({ceil.notes['exp_rate']})")
    torch.cuda.empty_cache()
    return ceil


def _mm_call(torch: Any, a: Any, b: Any, c: Any) -> Callable[[], Any]:
    return lambda: torch.mm(a, b, out=c)


def _copy_call(dst: Any, src: Any) -> Callable[[], Any]:
    return lambda: dst.copy_(src)


# ---------------------------------------------------------------------------------------------
# Implementations under test
# ---------------------------------------------------------------------------------------------


@dataclass
class Impl:
    """A way to compute a suite's operation. make(input_set) -> zero-argument call returning
    the output; graph_make likewise, for CUDA-graph capture (e.g. with out= given)."""

    name: str
    kind: str  # "flashscan" or "peer"
    make: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    graph_make: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    ctx: Callable[[], Any] = contextlib.nullcontext
    post: Callable[[Any], Any] | None = None  # output -> the guard's layout
    host: bool = False  # runs on the CPU (NumPy reference): host wall time only
    inplace: bool = False  # mutates its input set (state update): no graph-vs-eager check
    skip: str = ""  # status when not run: "skipped", "n/a", "unavailable"
    note: str = ""


def _first_line(exc: BaseException, limit: int = 160) -> str:
    s = str(exc).strip().splitlines()
    line = s[0] if s else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _detect_peers() -> dict[str, tuple[Any, str]]:
    """Optional peers: name -> (callable or None, why not)."""
    found: dict[str, tuple[Any, str]] = {}

    def attempt(name: str, module: str, attr: str) -> None:
        try:
            found[name] = (getattr(importlib.import_module(module), attr), "")
        except Exception as exc:  # ImportError, but also a broken build (OSError, ...)
            found[name] = (None, f"{type(exc).__name__}: {_first_line(exc)}")

    attempt("flash-attn", "flash_attn", "flash_attn_func")
    attempt("flash-attn-3", "flash_attn_interface", "flash_attn_func")
    attempt("mamba_ssm", "mamba_ssm.ops.selective_scan_interface", "selective_scan_fn")
    attempt(
        "mamba_ssm-triton",
        "mamba_ssm.ops.triton.selective_state_update",
        "selective_state_update",
    )
    return found


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------


class Runner:
    def __init__(
        self,
        torch: Any,
        fs: Any,
        device: Any,
        cfg: Config,
        timer: Timer,
        ceil: Ceilings,
        fs_ok: bool,
        fs_reason: str,
        peers: dict[str, tuple[Any, str]],
        log: Callable[[str], None],
    ) -> None:
        self.torch, self.fs, self.device, self.cfg = torch, fs, device, cfg
        self.timer, self.ceil, self.log = timer, ceil, log
        self.fs_ok, self.fs_reason, self.peers = fs_ok, fs_reason, peers
        self.rows: list[Row] = []
        self.l2 = L2_DEFAULT_BYTES
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            self.l2 = int(getattr(props, "L2_cache_size", 0) or L2_DEFAULT_BYTES)
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

    # -- helpers ---------------------------------------------------------------------------

    def _nsets(self, set_bytes: float) -> int:
        """Input sets to rotate so that together they exceed the L2 cache (3x)."""
        if set_bytes >= 2 * self.l2:
            return 1
        return max(2, min(self.cfg.max_sets, math.ceil(3 * self.l2 / max(set_bytes, 1.0))))

    def _randn(self, *shape: int, dtype: str = "fp32") -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtypes[dtype])

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _fs_impl(self, make: Any, graph_make: Any = None, inplace: bool = False) -> Impl:
        if not self.fs_ok:
            return Impl("flashscan", "flashscan", skip="unavailable", note=self.fs_reason)
        return Impl("flashscan", "flashscan", make=make, graph_make=graph_make, inplace=inplace)

    def _peer(self, name: str) -> Any:
        return self.peers.get(name, (None, ""))[0]

    def _emit(self, row: Row) -> None:
        self.rows.append(row)
        self.log(f"{row.suite:<12} {row.shape:<34} {row.impl:<16} {_row_summary(row)}")

    # -- one implementation at one shape ----------------------------------------------------

    def run_impl(
        self,
        suite: str,
        shape: str,
        params: dict[str, Any],
        impl: Impl,
        sets: list[dict[str, Any]],
        guard: Any,
        cost: tuple[float, float, float],
        modes: tuple[str, ...],
    ) -> Row:
        flops, nbytes, exps = cost
        row = Row(suite, shape, dict(params), impl.name, impl.kind, flops=flops, bytes=nbytes)
        row.exps = exps
        row.note = impl.note
        row.floors = _floors(self.ceil, flops, nbytes, exps)
        if row.floors:
            row.floor_bound = max(row.floors, key=lambda k: row.floors[k])
            row.floor_s = row.floors[row.floor_bound]
        if impl.skip or impl.make is None:
            row.status = impl.skip or "skipped"
            row.note = impl.note
            self._emit(row)
            return row
        torch = self.torch
        try:
            with warnings.catch_warnings(), impl.ctx():
                if impl.kind != "flashscan":  # e.g. SDPA explaining why a backend declines
                    warnings.simplefilter("ignore", UserWarning)
                # correctness guard: one call on the first set, against the float64 reference
                cset = guard.prepare(sets[0])
                fn = impl.make(cset)
                t0 = time.perf_counter()
                out = fn()
                if not impl.host:
                    self._sync()
                row.first_call_s = time.perf_counter() - t0
                ok, row.check = guard.check(impl.post(out) if impl.post else out, cset, impl.host)
                del out
                if not ok:
                    row.status = "FAILED"
                    row.note = (
                        f"output off: relative RMS error {row.check.get('rel_rms_err', 0):.3g} "
                        f"(tolerance {row.check.get('tol_rel_rms', 0):.3g}), max error "
                        f"{row.check.get('max_abs_err', 0):.3g} of max |ref| "
                        f"{row.check.get('ref_max_abs', 0):.3g}"
                    )
                if impl.host:  # host memory is not the GPU's L2: one set is enough
                    row.cpu_s = self.timer.host(impl.make(sets[0]))
                else:
                    fns = [impl.make(st) for st in sets]
                    call = _rotate(fns)
                    if "gpu" in modes:
                        row.gpu_s = self.timer.gpu(call)
                    if "wall" in modes:
                        row.wall_s = self.timer.wall(call)
                        row.sync_s = self.timer.call_sync(call)
                    if "graph" in modes:
                        self._graph(row, impl, sets)
                    del fns, call
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            msg = _first_line(exc)
            text = str(exc)
            unsupported = any(
                m in text for m in ("No available kernel", "No viable backend")
            ) or type(exc).__name__ in (
                "UnsupportedError",
                "NotImplementedError",
            )
            row.status = "n/a" if unsupported else "error"
            row.note = f"{type(exc).__name__}: {msg}"
            if "out of memory" in str(exc).lower():
                with contextlib.suppress(Exception):
                    torch.cuda.empty_cache()
        self._emit(row)
        return row

    def _graph(self, row: Row, impl: Impl, sets: list[dict[str, Any]]) -> None:
        """Capture one call per graph (with out= where the impl has it), replay in rotation."""
        if self.device.type != "cuda":
            return
        torch = self.torch
        make = impl.graph_make or impl.make
        assert make is not None
        graphs: list[Any] = []
        try:
            outs = []
            for st in sets[: max(1, self.cfg.graph_sets)]:
                g, o = self._capture(make(st))
                graphs.append(g)
                outs.append(o)
            if not impl.inplace:
                # poison the graph's output, replay, compare with an eager call
                got = _as_torch(torch, impl.post(outs[0]) if impl.post else outs[0], self.device)
                if got.is_floating_point():
                    got.fill_(float("nan"))
                graphs[0].replay()
                self._sync()
                got = got.clone()
                ref = impl.make(sets[0])()  # type: ignore[misc]
                ref = _as_torch(torch, impl.post(ref) if impl.post else ref, self.device)
                tol = _GUARD_RMS.get(str(row.params.get("dtype")), 2e-2)
                ok, m = _compare(torch, got, ref, tol)
                row.check["graph_vs_eager"] = m
                if not ok:
                    row.status = "FAILED"
                    row.note = (row.note + "; " if row.note else "") + "graph replay != eager"
            replays = [g.replay for g in graphs]
            row.graph_s = self.timer.gpu(_rotate(replays))
            row.graph_wall_s = self.timer.wall(_rotate(replays))
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            row.note = (row.note + "; " if row.note else "") + (
                f"graph capture failed: {type(exc).__name__}: {_first_line(exc, 100)}"
            )
            with contextlib.suppress(Exception):
                self._sync()
        finally:
            del graphs

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        torch = self.torch
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        self._sync()
        return g, out

    def _anchor_rows(
        self,
        suite: str,
        key: tuple[Any, ...],
        shape: str,
        params: dict[str, Any],
        cost: tuple[float, float, float],
    ) -> None:
        for a_suite, a_key, seconds, column, what in _ANCHORS:
            if a_suite != suite or a_key != key:
                continue
            row = Row(suite, shape, dict(params), f"mamba_ssm {ANCHOR_LABEL}", "anchor")
            row.flops, row.bytes, row.exps = cost
            row.floors = _floors(self.ceil, *cost)
            if row.floors:
                row.floor_bound = max(row.floors, key=lambda k: row.floors[k])
                row.floor_s = row.floors[row.floor_bound]
            row.status = "anchor"
            row.note = what
            if column == "gpu":
                row.gpu_s = seconds
            else:
                row.wall_s = seconds
            self._emit(row)

    def _finish_shape(self) -> None:
        self._sync()
        with contextlib.suppress(Exception):
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()

    # -- attention --------------------------------------------------------------------------

    def _attention_impls(
        self, b: int, s: int, h: int, d: int, dtype: str, causal: bool
    ) -> list[Impl]:
        torch, fs, cfg = self.torch, self.fs, self.cfg
        impls: list[Impl] = []

        def fs_make(st: dict[str, Any]) -> Callable[[], Any]:
            q, k, v = st["q"], st["k"], st["v"]
            return lambda: fs.flash_attn_func(q, k, v, causal=causal)

        def fs_graph_make(st: dict[str, Any]) -> Callable[[], Any]:
            q, k, v = st["q"], st["k"], st["v"]
            o = torch.empty_like(q)
            return lambda: fs.flash_attn_func(q, k, v, causal=causal, out=o)

        impls.append(self._fs_impl(fs_make, fs_graph_make))

        sdpa_reason = ""
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except Exception as exc:
            SDPBackend = sdpa_kernel = None
            sdpa_reason = f"torch.nn.attention.sdpa_kernel not importable ({exc})"
        F = torch.nn.functional

        def sdpa_make(st: dict[str, Any]) -> Callable[[], Any]:
            # SDPA's layout is (batch, nheads, seqlen, headdim): views, made outside the call
            qt, kt, vt = (st[x].transpose(1, 2) for x in "qkv")
            return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def sdpa_post(o: Any) -> Any:
            return o.transpose(1, 2)

        for name, backend_name in (
            ("sdpa-flash", "FLASH_ATTENTION"),
            ("sdpa-cudnn", "CUDNN_ATTENTION"),
            ("sdpa-efficient", "EFFICIENT_ATTENTION"),
            ("sdpa-math", "MATH"),
        ):
            backend = getattr(SDPBackend, backend_name, None) if SDPBackend is not None else None
            if backend is None:
                why = sdpa_reason if SDPBackend is None else f"SDPBackend.{backend_name} missing"
                impls.append(Impl(name, "peer", skip="n/a", note=why))
                continue
            if backend_name == "MATH" and b * h * s * s > cfg.attn_math_max_scores:
                impls.append(
                    Impl(
                        name,
                        "peer",
                        skip="skipped",
                        note=f"score matrix too large for math (b*h*sq*sk = {b * h * s * s:.3g})",
                    )
                )
                continue
            impls.append(
                Impl(
                    name,
                    "peer",
                    make=sdpa_make,
                    ctx=_sdpa_ctx(sdpa_kernel, backend),
                    post=sdpa_post,
                )
            )

        for name in ("flash-attn", "flash-attn-3"):
            fa = self._peer(name)
            if fa is None:
                continue
            if dtype == "fp32":
                impls.append(Impl(name, "peer", skip="n/a", note="fp16/bf16 only"))
                continue
            impls.append(Impl(name, "peer", make=_fa_make(fa, causal), post=_first_output))

        if b * h * s * s * d <= cfg.numpy_max_attn:
            ref = self.fs.reference

            def np_make(st: dict[str, Any]) -> Callable[[], Any]:
                q, k, v = (st[x].float().cpu().numpy() for x in "qkv")
                return lambda: ref.flash_attn_func(q, k, v, causal=causal)

            impls.append(
                Impl(
                    "numpy-ref",
                    "peer",
                    make=np_make,
                    host=True,
                    note="flashscan.reference on the CPU, float32",
                )
            )
        return impls

    def attention_shape(
        self,
        suite: str,
        b: int,
        s: int,
        h: int,
        d: int,
        dtype: str,
        causal: bool,
        modes: tuple[str, ...],
    ) -> None:
        flops, nbytes = attention_cost(b, s, s, h, h, d, dtype, causal)
        shape = f"b{b} s{s} h{h} d{d} {dtype}" + (" causal" if causal else "")
        params = {
            "batch": b,
            "seqlen": s,
            "nheads": h,
            "headdim": d,
            "dtype": dtype,
            "causal": causal,
        }
        try:
            sets = [
                {x: self._randn(b, s, h, d, dtype=dtype) for x in "qkv"}
                for _ in range(self._nsets(nbytes))
            ]
            guard = _AttnGuard(self, sets[0], causal, dtype)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            self.log(f"{suite} {shape}: inputs/reference failed ({_first_line(exc)})")
            self._finish_shape()
            return
        for impl in self._attention_impls(b, s, h, d, dtype, causal):
            self.run_impl(suite, shape, params, impl, sets, guard, (flops, nbytes, 0.0), modes)
        del sets, guard
        self._finish_shape()

    def run_attention(self) -> None:
        cfg = self.cfg
        for d in cfg.attn_head_dims:
            h = max(1, cfg.attn_width // d)
            for causal in (False, True):
                for s in cfg.attn_seqlens:
                    b = max(1, cfg.attn_tokens // s)
                    self.attention_shape("attention", b, s, h, d, cfg.attn_dtype, causal, ("gpu",))

    def run_latency(self) -> None:
        cfg = self.cfg
        for dtype in cfg.latency_dtypes:
            for b in cfg.latency_batches:
                for causal in (False, True):
                    self.attention_shape(
                        "latency",
                        b,
                        cfg.latency_seqlen,
                        cfg.latency_heads,
                        cfg.latency_headdim,
                        dtype,
                        causal,
                        ("gpu", "wall", "graph"),
                    )

    # -- selective scan ---------------------------------------------------------------------

    def _scan_set(self, s: ScanShape) -> dict[str, Any]:
        torch, dev = self.torch, self.device
        return {
            "u": self._randn(s.batch, s.dim, s.seqlen, dtype=s.dtype),
            "delta": (self._randn(s.batch, s.dim, s.seqlen) * 0.5 - 1.0).to(self.dtypes[s.dtype]),
            "A": -(torch.rand(s.dim, s.dstate, device=dev) + 0.5),
            "B": self._randn(s.batch, s.dstate, s.seqlen, dtype=s.dtype),
            "C": self._randn(s.batch, s.dstate, s.seqlen, dtype=s.dtype),
            "D": self._randn(s.dim),
            "z": self._randn(s.batch, s.dim, s.seqlen, dtype=s.dtype),
        }

    def _scan_impls(self, s: ScanShape) -> list[Impl]:
        torch, fs, cfg = self.torch, self.fs, self.cfg
        impls: list[Impl] = []

        def fs_make(st: dict[str, Any]) -> Callable[[], Any]:
            u, delta, A, B, C, D, z = (st[k] for k in _SCAN_KEYS)
            scan = fs.selective_scan_fn
            return lambda: scan(u, delta, A, B, C, D, z, delta_softplus=True)

        impls.append(self._fs_impl(fs_make))
        mamba = self._peer("mamba_ssm")
        if mamba is not None:

            def mamba_make(st: dict[str, Any]) -> Callable[[], Any]:
                u, delta, A, B, C, D, z = (st[k] for k in _SCAN_KEYS)
                return lambda: mamba(u, delta, A, B, C, D, z, delta_softplus=True)

            impls.append(Impl("mamba_ssm", "peer", make=mamba_make, post=_first_output))
        if s.seqlen <= cfg.torch_loop_max_seqlen:

            def loop_make(st: dict[str, Any]) -> Callable[[], Any]:
                u, delta, A, B, C, D, z = (st[k] for k in _SCAN_KEYS)
                return lambda: torch_selective_scan(
                    torch, u, delta, A, B, C, D, z, delta_softplus=True
                )[0]

            impls.append(
                Impl(
                    "torch-loop",
                    "peer",
                    make=loop_make,
                    note="plain torch, float32, one addcmul per step",
                )
            )
        if s.batch * s.dim * s.seqlen * s.dstate <= cfg.numpy_max_scan:
            ref = fs.reference

            def np_make(st: dict[str, Any]) -> Callable[[], Any]:
                u, delta, A, B, C, D, z = (st[k].float().cpu().numpy() for k in _SCAN_KEYS)
                return lambda: ref.selective_scan_fn(u, delta, A, B, C, D, z, delta_softplus=True)

            impls.append(
                Impl(
                    "numpy-ref",
                    "peer",
                    make=np_make,
                    host=True,
                    note="flashscan.reference on the CPU, float32",
                )
            )
        return impls

    def run_scan(self) -> None:
        for s in self.cfg.scan_shapes:
            nbytes, exps = scan_cost(s)
            shape = f"b{s.batch} d{s.dim} L{s.seqlen} n{s.dstate} {s.dtype}"
            params = dataclasses.asdict(s)
            params.update(delta_softplus=True, D=True, z=True, varying_BC=True, delta_bias=False)
            latency_like = s.seqlen <= self.cfg.torch_loop_max_seqlen
            modes = ("gpu", "wall", "graph") if latency_like else ("gpu",)
            try:
                sets = [self._scan_set(s) for _ in range(self._nsets(nbytes))]
                guard = _ScanGuard(self, sets[0], s.dtype)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                self.log(f"scan {shape}: inputs/reference failed ({_first_line(exc)})")
                self._finish_shape()
                continue
            for impl in self._scan_impls(s):
                self.run_impl("scan", shape, params, impl, sets, guard, (0.0, nbytes, exps), modes)
            key = (s.batch, s.dim, s.seqlen, s.dstate, s.dtype)
            self._anchor_rows("scan", key, shape, params, (0.0, nbytes, exps))
            del sets, guard
            self._finish_shape()

    # -- state update -----------------------------------------------------------------------

    def _state_set(self, s: StateShape) -> dict[str, Any]:
        torch, dev = self.torch, self.device
        return {
            "state": self._randn(s.batch, s.dim, s.dstate),
            "x": self._randn(s.batch, s.dim, dtype=s.dtype),
            "dt": (self._randn(s.batch, s.dim) * 0.5 - 1.0).to(self.dtypes[s.dtype]),
            "A": -(torch.rand(s.dim, s.dstate, device=dev) + 0.5),
            "B": self._randn(s.batch, s.dstate, dtype=s.dtype),
            "C": self._randn(s.batch, s.dstate, dtype=s.dtype),
            "D": self._randn(s.dim),
            "z": self._randn(s.batch, s.dim, dtype=s.dtype),
            "dt_bias": self._randn(s.dim) * 0.5,
        }

    def _state_impls(self, s: StateShape) -> list[Impl]:
        torch, fs, cfg = self.torch, self.fs, self.cfg
        impls: list[Impl] = []

        def fs_make(st: dict[str, Any]) -> Callable[[], Any]:
            state, x, dt, A, B, C, D, z, dt_bias = (st[k] for k in _STATE_KEYS)
            update = fs.selective_state_update
            return lambda: update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True)

        impls.append(self._fs_impl(fs_make, inplace=True))
        mamba = self._peer("mamba_ssm-triton")
        if mamba is not None:

            def mamba_make(st: dict[str, Any]) -> Callable[[], Any]:
                state, x, dt, A, B, C, D, z, dt_bias = (st[k] for k in _STATE_KEYS)
                return lambda: mamba(
                    state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True
                )

            impls.append(Impl("mamba_ssm-triton", "peer", make=mamba_make, inplace=True))

        def torch_make(st: dict[str, Any]) -> Callable[[], Any]:
            state, x, dt, A, B, C, D, z, dt_bias = (st[k] for k in _STATE_KEYS)
            return lambda: torch_state_update(
                torch, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True, inplace=True
            )[0].to(x.dtype)

        impls.append(
            Impl(
                "torch",
                "peer",
                make=torch_make,
                inplace=True,
                note="plain torch, float32, state updated in place",
            )
        )
        if s.batch * s.dim * s.dstate <= cfg.numpy_max_state:
            ref = fs.reference

            def np_make(st: dict[str, Any]) -> Callable[[], Any]:
                state, x, dt, A, B, C, D, z, dt_bias = (
                    st[k].float().cpu().numpy() for k in _STATE_KEYS
                )
                return lambda: ref.selective_state_update(
                    state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True
                )

            impls.append(
                Impl(
                    "numpy-ref",
                    "peer",
                    make=np_make,
                    host=True,
                    inplace=True,
                    note="flashscan.reference on the CPU, float32",
                )
            )
        return impls

    def run_state_update(self) -> None:
        for s in self.cfg.state_shapes:
            nbytes, exps = state_update_cost(s)
            shape = f"b{s.batch} d{s.dim} n{s.dstate} {s.dtype}"
            params = dataclasses.asdict(s)
            params.update(dt_softplus=True, D=True, z=True, dt_bias=True)
            try:
                sets = [self._state_set(s) for _ in range(self._nsets(nbytes))]
                guard = _StateGuard(self, sets[0], s.dtype)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                self.log(f"state_update {shape}: inputs/reference failed ({_first_line(exc)})")
                self._finish_shape()
                continue
            for impl in self._state_impls(s):
                self.run_impl(
                    "state_update",
                    shape,
                    params,
                    impl,
                    sets,
                    guard,
                    (0.0, nbytes, exps),
                    ("gpu", "wall", "graph"),
                )
            key = (s.batch, s.dim, s.dstate, s.dtype)
            self._anchor_rows("state_update", key, shape, params, (0.0, nbytes, exps))
            del sets, guard
            self._finish_shape()


def _sdpa_ctx(sdpa_kernel: Any, backend: Any) -> Callable[[], Any]:
    return lambda: sdpa_kernel(backend)


def _fa_make(fa: Any, causal: bool) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def make(st: dict[str, Any]) -> Callable[[], Any]:
        q, k, v = st["q"], st["k"], st["v"]
        return lambda: fa(q, k, v, causal=causal)

    return make


def _first_output(o: Any) -> Any:
    return o[0] if isinstance(o, (tuple, list)) else o


# ---------------------------------------------------------------------------------------------
# Cold start: fresh processes, empty and then warm kernel cache
# ---------------------------------------------------------------------------------------------

_COLD_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import torch
t_torch = time.perf_counter()
op = sys.argv[1]
dev = torch.device("cuda")
g = torch.Generator(device=dev)
g.manual_seed(0)
def rn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=dev, dtype=dtype, generator=g)
if op in ("attention", "sdpa", "flash-attn"):
    inputs = {"q": rn(32, 60, 8, 64), "k": rn(32, 60, 8, 64), "v": rn(32, 60, 8, 64)}
else:
    b, d, L, n = 32, 512, 60, 16
    inputs = {
        "u": rn(b, d, L), "delta": rn(b, d, L) * 0.5 - 1.0,
        "A": -(torch.rand(d, n, device=dev, generator=g) + 0.5),
        "B": rn(b, n, L), "C": rn(b, n, L),
        "D": torch.randn(d, device=dev, generator=g), "z": rn(b, d, L),
    }
a = inputs
torch.cuda.synchronize()
t_inputs = time.perf_counter()
if op == "attention":
    import flashscan
    call = lambda: flashscan.flash_attn_func(a["q"], a["k"], a["v"], causal=True)
elif op == "scan":
    import flashscan
    call = lambda: flashscan.selective_scan_fn(
        a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["z"], delta_softplus=True)
elif op == "sdpa":
    import torch.nn.functional as F
    qt, kt, vt = (a[x].transpose(1, 2) for x in "qkv")
    call = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
elif op == "flash-attn":
    from flash_attn import flash_attn_func
    call = lambda: flash_attn_func(a["q"], a["k"], a["v"], causal=True)
elif op == "mamba_ssm":
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    call = lambda: selective_scan_fn(
        a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["z"], delta_softplus=True)
else:
    raise SystemExit("unknown op " + op)
t_import = time.perf_counter()
out = call()
torch.cuda.synchronize()
t_first = time.perf_counter()
out2 = call()
torch.cuda.synchronize()
t_second = time.perf_counter()
from flashscan.bench import _cold_check
check = _cold_check(op, inputs, out)
print("FLASHSCAN_COLD_START " + json.dumps({
    "import_torch_s": t_torch - t_start,
    "inputs_s": t_inputs - t_torch,
    "import_s": t_import - t_inputs,
    "first_call_s": t_first - t_import,
    "import_to_first_result_s": t_first - t_inputs,
    "second_call_s": t_second - t_first,
    "check": check,
}), flush=True)
"""


def _cold_check(op: str, inputs: dict[str, Any], out: Any) -> dict[str, Any]:
    """Used by the cold-start child after its timings: the result against float64."""
    import torch

    out = _first_output(out)
    if op in ("attention", "sdpa", "flash-attn"):
        q = inputs["q"]
        rows = torch.arange(q.shape[1], device=q.device)
        bidx = list(range(q.shape[0]))
        ref = attention_rows_reference(torch, q, inputs["k"], inputs["v"], True, bidx, rows)
        ok, m = _compare(torch, out, ref, _GUARD_RMS["bf16"])
    else:
        ref, _ = torch_selective_scan(torch, **inputs, delta_softplus=True, acc=torch.float64)
        ok, m = _compare(torch, out, ref, _GUARD_RMS["bf16"])
    m["ok"] = ok
    return m


def _dir_stats(path: str) -> tuple[int, int]:
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for nm in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(root, nm))
    return files, size


def run_cold_start(
    fs: Any, peers: dict[str, tuple[Any, str]], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """flashscan: a fresh process with FLASHSCAN_CACHE_DIR empty (cold), then the same dir
    again (warm). Peers: one fresh process each (they have no run-time compile cache)."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fs.__file__)))
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg_parent, base_env.get("PYTHONPATH", "")) if p
    )
    base_env["FLASHSCAN_FALLBACK"] = "error"
    base_env["PYTHONUNBUFFERED"] = "1"
    plan: list[tuple[str, str, str | None]] = []
    dirs: list[str] = []
    for op in ("attention", "scan"):
        d = tempfile.mkdtemp(prefix=f"flashscan-cold-{op}-")
        dirs.append(d)
        plan += [(op, "cold (empty cache)", d), (op, "warm (disk cache)", d)]
    plan.append(("sdpa", "fresh process", None))
    if peers.get("flash-attn", (None, ""))[0] is not None:
        plan.append(("flash-attn", "fresh process", None))
    if peers.get("mamba_ssm", (None, ""))[0] is not None:
        plan.append(("mamba_ssm", "fresh process", None))
    results: list[dict[str, Any]] = []
    try:
        for op, phase, cache in plan:
            env = dict(base_env)
            if cache is not None:
                env["FLASHSCAN_CACHE_DIR"] = cache
            res: dict[str, Any] = {"op": op, "phase": phase}
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", _COLD_CHILD, op],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                res["process_s"] = time.perf_counter() - t0
                line = next(
                    (
                        ln
                        for ln in proc.stdout.splitlines()
                        if ln.startswith("FLASHSCAN_COLD_START ")
                    ),
                    None,
                )
                if proc.returncode != 0 or line is None:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                    res["error"] = f"exit {proc.returncode}: " + " | ".join(tail)[-300:]
                else:
                    res.update(json.loads(line.split(" ", 1)[1]))
            except subprocess.TimeoutExpired:
                res["error"] = "timed out after 600 s"
            if cache is not None:
                res["cache_files"], res["cache_bytes"] = _dir_stats(cache)
            results.append(res)
            if "error" in res:
                log(f"cold-start   {op:<12} {phase:<20} error: {res['error']}")
            else:
                log(
                    f"cold-start   {op:<12} {phase:<20} import -> first result "
                    f"{res['import_to_first_result_s'] * 1e3:.0f} ms "
                    f"(first call {res['first_call_s'] * 1e3:.0f} ms, "
                    f"correct: {res['check'].get('ok')})"
                )
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return results


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1.0:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _fmt_x(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}×"


def _rate(row: Row, t: float | None) -> tuple[float | None, str]:
    """(value, unit): TFLOP/s for attention, GB/s otherwise."""
    if t is None or t <= 0:
        return None, ""
    if row.flops:
        return row.flops / t / 1e12, "TFLOP/s"
    if row.bytes:
        return row.bytes / t / 1e9, "GB/s"
    return None, ""


def _fmt_rate(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _row_summary(row: Row) -> str:
    if row.status in ("skipped", "n/a", "unavailable", "error"):
        return f"{row.status}: {row.note}"
    parts = [] if row.status in ("ok", "anchor") else [row.status]
    if row.gpu_s is not None:
        v, unit = _rate(row, row.gpu_s)
        parts.append(f"gpu {_fmt_t(row.gpu_s)}" + (f" {_fmt_rate(v)} {unit}" if v else ""))
        if row.floor_s:
            parts.append(f"{row.gpu_s / row.floor_s:.2f}x floor")
    if row.cpu_s is not None:
        parts.append(f"host {_fmt_t(row.cpu_s)}")
    if row.first_call_s is not None and row.first_call_s > 0.05:
        parts.append(f"first call {_fmt_t(row.first_call_s)}")
    if row.wall_s is not None:
        parts.append(f"wall/call {_fmt_t(row.wall_s)}")
    if row.sync_s is not None:
        parts.append(f"call+sync {_fmt_t(row.sync_s)}")
    if row.graph_s is not None:
        parts.append(f"graph {_fmt_t(row.graph_s)} (wall {_fmt_t(row.graph_wall_s)})")
    if row.note and row.status != "ok":
        parts.append(row.note)
    return ", ".join(parts)


def _speedups(fs_row: Row | None, row: Row) -> tuple[float | None, float | None]:
    """flashscan's speedup over `row` (row time / flashscan time): (by the row's main time,
    by wall time per call). GPU rows compare GPU times; host rows (NumPy) compare their host
    time with flashscan's wall time per call (its GPU time when no wall time was taken);
    rows with a wall time only (anchors given per call from Python) compare wall times."""
    if fs_row is None or fs_row is row or fs_row.status != "ok":
        return None, None
    if row.status not in ("ok", "anchor"):  # a FAILED peer's time means nothing
        return None, None
    mine: float | None = None
    theirs: float | None = None
    if row.gpu_s is not None:
        mine, theirs = fs_row.gpu_s, row.gpu_s
    elif row.cpu_s is not None:
        mine, theirs = fs_row.wall_s or fs_row.gpu_s, row.cpu_s
    elif row.wall_s is not None:
        mine, theirs = fs_row.wall_s, row.wall_s
    by_main = theirs / mine if (theirs and mine) else None
    by_wall = None
    if row.gpu_s is not None and row.wall_s is not None and fs_row.wall_s:
        by_wall = row.wall_s / fs_row.wall_s
    return by_main, by_wall


def _groups(rows: list[Row], suite: str) -> list[tuple[str, list[Row]]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        if r.suite == suite:
            out.setdefault(r.shape, []).append(r)
    return list(out.items())


def _fs_of(group: list[Row]) -> Row | None:
    return next((r for r in group if r.kind == "flashscan"), None)


def _status_cell(row: Row) -> str:
    if row.status == "ok":
        return "ok"
    if row.status == "anchor":
        return "**not measured in this run**"
    return f"**{row.status}**" if row.status in ("FAILED", "error") else row.status


def _attention_wide(rows: list[Row]) -> str:
    groups = _groups(rows, "attention")
    if not groups:
        return ""
    peers: list[str] = []
    for _, g in groups:
        for r in g:
            if r.kind != "flashscan" and r.impl not in peers:
                peers.append(r.impl)
    head = [
        "headdim",
        "causal",
        "seqlen",
        "batch × heads",
        "floor",
        "flashscan",
        "TFLOP/s",
        "× floor",
    ] + peers
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, g in groups:
        p = g[0].params
        fs = _fs_of(g)
        cells = [
            str(p["headdim"]),
            "yes" if p["causal"] else "no",
            str(p["seqlen"]),
            f"{p['batch']} × {p['nheads']}",
            _fmt_t(g[0].floor_s),
        ]
        if fs is None or fs.gpu_s is None:
            cells += [fs.status if fs else "—", "—", "—"]
        else:
            tf, _ = _rate(fs, fs.gpu_s)
            mark = "" if fs.status == "ok" else f" **{fs.status}**"
            cells += [
                _fmt_t(fs.gpu_s) + mark,
                _fmt_rate(tf),
                f"{fs.gpu_s / fs.floor_s:.2f}" if fs.floor_s else "—",
            ]
        by_impl = {r.impl: r for r in g}
        for name in peers:
            r = by_impl.get(name)
            if r is None:
                cells.append("—")
            elif r.gpu_s is None and r.cpu_s is None:
                cells.append(r.status)
            else:
                t = r.main_s
                tf, _ = _rate(r, t)
                sp, _ = _speedups(fs, r)
                txt = f"{_fmt_rate(tf)}" + (f" ({_fmt_x(sp)})" if sp else "")
                if r.cpu_s is not None:
                    txt = f"{_fmt_t(r.cpu_s)} CPU" + (f" ({_fmt_x(sp)})" if sp else "")
                if r.status != "ok":
                    txt += f" **{r.status}**"
                cells.append(txt)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _long_table(rows: list[Row], suite: str) -> str:
    groups = _groups(rows, suite)
    if not groups:
        return ""
    head = [
        "shape",
        "impl",
        "status",
        "GPU time",
        "rate",
        "floor (bound)",
        "× floor",
        "wall / call",
        "call + sync",
        "graph GPU",
        "graph wall",
        "flashscan speedup",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, g in groups:
        fs = _fs_of(g)
        for i, r in enumerate(g):
            t = r.main_s
            v, unit = _rate(r, r.gpu_s)
            floor = f"{_fmt_t(r.floor_s)} ({r.floor_bound})" if r.floor_s else "—"
            xfloor = f"{r.gpu_s / r.floor_s:.2f}" if (r.gpu_s and r.floor_s) else "—"
            gpu = _fmt_t(r.gpu_s) if r.cpu_s is None else f"{_fmt_t(r.cpu_s)} (CPU)"
            sp_main, sp_wall = _speedups(fs, r)
            sp = []
            if sp_main is not None:
                sp.append(f"{_fmt_x(sp_main)}" + (" GPU" if r.gpu_s is not None else " wall"))
            if sp_wall is not None:
                sp.append(f"{_fmt_x(sp_wall)} wall")
            status = _status_cell(r)
            if r.note:
                note = r.note if len(r.note) <= 100 else r.note[:97] + "..."
                status += f" ({_cell(note)})"
            lines.append(
                "| "
                + " | ".join(
                    [
                        shape if i == 0 else "",
                        r.impl,
                        status,
                        gpu if t is not None else "—",
                        f"{_fmt_rate(v)} {unit}" if v else "—",
                        floor,
                        xfloor,
                        _fmt_t(r.wall_s),
                        _fmt_t(r.sync_s),
                        _fmt_t(r.graph_s),
                        _fmt_t(r.graph_wall_s),
                        " / ".join(sp) if sp else "—",
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def _cold_table(cold: list[dict[str, Any]]) -> str:
    head = [
        "op",
        "phase",
        "process wall",
        "import torch",
        "import",
        "first call",
        "import → first result",
        "second call",
        "cache files",
        "correct",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cold:
        if "error" in c:
            lines.append(
                f"| {c['op']} | {c['phase']} | {_fmt_t(c.get('process_s'))} | "
                f"**error**: {_cell(c['error'])} |" + " |" * (len(head) - 4)
            )
            continue
        files = c.get("cache_files")
        cache = "—" if files is None else f"{files} ({c.get('cache_bytes', 0) / 1e6:.1f} MB)"
        lines.append(
            "| "
            + " | ".join(
                [
                    c["op"],
                    c["phase"],
                    _fmt_t(c.get("process_s")),
                    _fmt_t(c.get("import_torch_s")),
                    _fmt_t(c.get("import_s")),
                    _fmt_t(c.get("first_call_s")),
                    _fmt_t(c.get("import_to_first_result_s")),
                    _fmt_t(c.get("second_call_s")),
                    cache,
                    "yes" if c.get("check", {}).get("ok") else "**no**",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def render_markdown(
    meta: dict[str, Any],
    ceil: Ceilings,
    rows: list[Row],
    cold: list[dict[str, Any]] | None,
    peers: dict[str, tuple[Any, str]],
    plots: list[str],
) -> str:
    cfg_quick = meta.get("quick")
    out: list[str] = []
    out.append(
        f"# flashscan benchmark: {meta.get('device', '?')}, {meta.get('date', '?')}"
        + (" (quick)" if cfg_quick else "")
    )
    out.append("")
    for key, label in (
        ("device", "device"),
        ("compute_capability", "compute capability"),
        ("driver", "driver"),
        ("torch", "torch"),
        ("torch_cuda", "torch CUDA"),
        ("cudnn", "cuDNN"),
        ("triton", "triton"),
        ("python", "python"),
        ("flashscan", "flashscan"),
        ("flashscan_commit", "flashscan commit"),
        ("flashscan_backend", "flashscan backend"),
        ("nvrtc", "NVRTC"),
        ("date_utc", "date (UTC)"),
        ("command", "command"),
        ("timer", "GPU timer"),
    ):
        if meta.get(key) is not None:
            val = meta[key]
            out.append(f"- {label}: " + (f"`{val}`" if key == "command" else str(val)))
    out.append("")
    out.append("## Ceilings measured at the start of this run")
    out.append("")
    out.append("| ceiling | measured | how |")
    out.append("|---|---|---|")
    out.append(
        f"| device copy bandwidth | "
        f"{'—' if not ceil.copy_bw else f'{ceil.copy_bw / 1e12:.2f} TB/s'} | "
        f"{ceil.notes.get('copy_bw', '')} |"
    )
    out.append(
        f"| bf16 matmul | "
        f"{'—' if not ceil.matmul_rate else f'{ceil.matmul_rate / 1e12:.0f} TFLOP/s'} | "
        f"{ceil.notes.get('matmul_rate', '')} |"
    )
    out.append(
        f"| exp2 (special-function units) | "
        f"{'—' if not ceil.exp_rate else f'{ceil.exp_rate / 1e12:.2f} T/s'} | "
        f"{ceil.notes.get('exp_rate', '')} |"
    )
    out.append("")
    out.append("## How to read the tables")
    out.append("")
    out.append(
        "- Times are per call. **GPU time**: median of per-call CUDA-event timings with the L2 "
        "cache flushed before each call; inputs rotate among several random sets when one set "
        "would fit in L2. **wall / call**: `time.perf_counter()` around many back-to-back calls "
        "from Python closed by one `torch.cuda.synchronize()`, divided by the number of calls "
        "(what a caller pays per call, CPU overhead included). **call + sync**: median wall "
        "time of one call followed by a synchronize (a frame-by-frame caller waiting for its "
        "result). **graph GPU / graph wall**: the same call captured in a CUDA graph (flashscan "
        "attention with `out=` given; other calls allocate from the graph's pool), per replay; "
        "a graph's output is poisoned with NaN, replayed and compared with an eager call."
    )
    out.append(
        "- **floor** = max(FLOPs / bf16 matmul rate, bytes / copy bandwidth, exponentials / "
        "exp2 rate), with the ceilings above; the bound named is the largest term. **× floor** "
        "= GPU time / floor (1.00 would be at the ceiling)."
    )
    out.append(
        "- Attention: FLOPs = 4·b·h·sq·sk·d, halved when causal; bytes = q, k, v read once + "
        "out written once. Selective scan: bytes = u, delta, z read + out written (u's dtype), "
        "B and C (batch, dstate, seqlen) read, A (dim, dstate) and D (dim) fp32 read; "
        "exponentials = b·dim·seqlen·dstate. State update: bytes = fp32 state read + written, "
        "x, dt, z read + out written, B, C read, A, D, dt_bias read; exponentials = "
        "b·dim·dstate. Rates (TFLOP/s, GB/s) = those counts / GPU time."
    )
    out.append(
        "- **flashscan speedup** = peer time / flashscan time (above 1: flashscan is faster). "
        "Host rows (numpy-ref) and anchors given as time per call from Python are compared "
        "with flashscan's wall time per call."
    )
    out.append(
        "- Every row was checked before timing against a float64 torch reference (query rows "
        "spread over the sequence; scan channels sampled at large shapes) with a loose "
        "tolerance (relative RMS error <= 2e-2 bf16, 1e-2 fp16, 5e-3 fp32); **FAILED** marks "
        "a row whose output is off: its time means nothing."
    )
    out.append(
        f"- Rows labelled **{ANCHOR_LABEL}** are mamba_ssm figures measured on the project's "
        "H100 on 2026-11-22 and recorded in issue 4; they were **not measured in this run** "
        "and are shown so that the tables compare with mamba_ssm where it is not installed."
    )
    out.append(
        "- Slow peers only where they are not absurd: SDPA's math backend where "
        "b·h·sq·sk <= 2^28, the plain torch scan (torch-loop, one kernel per time step) at "
        "seqlen <= 256, the NumPy reference (numpy-ref, on the CPU) at tiny shapes. A peer "
        "that is not installed has no row (listed at the end)."
    )
    out.append("")
    for err in meta.get("errors") or []:
        out.append(f"**{err}**")
        out.append("")
    sections = (
        ("attention", "Attention forward (bf16, batch·seqlen = 16384, nheads·headdim = 2048)"),
        ("latency", "Real-time latency: attention at seqlen 60, 8 heads, headdim 64"),
        ("scan", "Selective scan (delta_softplus, D, z, B/C varying)"),
        ("state_update", "State update (one decode step, dt_bias, dt_softplus, D, z)"),
    )
    for suite, title in sections:
        if not any(r.suite == suite for r in rows):
            continue
        out.append(f"## {title}")
        out.append("")
        if suite == "attention":
            out.append("Peer cells: the peer's TFLOP/s (flashscan speedup).")
            out.append("")
            out.append(_attention_wide(rows))
            out.append("")
            out.append("<details><summary>all attention rows</summary>")
            out.append("")
            out.append(_long_table(rows, suite))
            out.append("")
            out.append("</details>")
        else:
            out.append(_long_table(rows, suite))
        out.append("")
    if cold is not None:
        out.append("## Cold start: fresh process to first correct result")
        out.append("")
        out.append(
            "Attention: batch 32, seqlen 60, 8 heads, headdim 64, bf16, causal. Scan: batch 32, "
            "dim 512, seqlen 60, dstate 16, bf16. flashscan runs twice with FLASHSCAN_CACHE_DIR "
            "set to one new directory: empty (NVRTC compiles) and then filled by the first run "
            "(kernels loaded from disk). **import → first result** is import of the package + "
            "the first call + synchronize (torch already imported and its CUDA context made). "
            "Installing or building the peers' wheels is not measured here."
        )
        out.append("")
        out.append(_cold_table(cold))
        out.append("")
    absent = [f"{name} ({why})" for name, (fn, why) in peers.items() if fn is None]
    if absent:
        out.append("## Peers not present in this environment (skipped)")
        out.append("")
        out.extend(f"- {a}" for a in absent)
        out.append("")
    if plots:
        out.append("## Plots")
        out.append("")
        out.extend(f"![{os.path.splitext(p)[0]}]({p})" for p in plots)
        out.append("")
    if meta.get("interrupted"):
        out.append("**The run was interrupted: the tables above are partial.**")
        out.append("")
    return "\n".join(out)


def write_plots(
    rows: list[Row], out_dir: str, meta: dict[str, Any], ceil: Ceilings | None = None
) -> tuple[list[str], str]:
    """PNG plots beside results.md; ([] and why) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return [], f"matplotlib not importable ({type(exc).__name__}): plots skipped"
    made: list[str] = []
    device = meta.get("device", "")

    att = [r for r in rows if r.suite == "attention" and r.gpu_s and r.status == "ok"]
    if att:
        hds = sorted({r.params["headdim"] for r in att})
        impls = list(dict.fromkeys(r.impl for r in att))
        fig, axes = plt.subplots(1, len(hds), figsize=(6 * len(hds), 4.5), squeeze=False)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for ax, hd in zip(axes[0], hds):
            for i, impl in enumerate(impls):
                for causal, style in ((False, "-"), (True, "--")):
                    pts = sorted(
                        (r.params["seqlen"], r.flops / r.gpu_s / 1e12)
                        for r in att
                        if r.impl == impl
                        and r.params["headdim"] == hd
                        and r.params["causal"] == causal
                    )
                    if pts:
                        ax.plot(
                            [p[0] for p in pts],
                            [p[1] for p in pts],
                            style,
                            marker="o",
                            color=colors[i % len(colors)],
                            label=f"{impl}{' causal' if causal else ''}",
                        )
            if ceil is not None and ceil.matmul_rate:
                ax.axhline(
                    ceil.matmul_rate / 1e12,
                    color="gray",
                    linestyle=":",
                    label="bf16 matmul ceiling (measured)",
                )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("seqlen (batch·seqlen = 16384)")
            ax.set_ylabel("TFLOP/s (forward)")
            ax.set_title(f"attention fwd, headdim {hd}, bf16")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{device}: higher is better")
        fig.tight_layout()
        name = "attention_tflops.png"
        fig.savefig(os.path.join(out_dir, name), dpi=120)
        plt.close(fig)
        made.append(name)

    for suite, column, ylabel, title in (
        ("scan", "main", "time per call (µs, log)", "selective scan fwd (GPU time; CPU for numpy)"),
        ("state_update", "wall", "wall time per call from Python (µs, log)", "state update"),
        (
            "latency",
            "wall",
            "wall time per call from Python (µs, log)",
            "attention at seqlen 60 (real-time)",
        ),
    ):
        groups = _groups(rows, suite)
        if not groups:
            continue
        impls = list(
            dict.fromkeys(
                r.impl
                for _, g in groups
                for r in g
                if r.status in ("ok", "anchor")
                and (r.main_s if column == "main" else (r.wall_s or r.cpu_s))
            )
        )
        width = 0.8 / max(1, len(impls))
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.5))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        any_bar = False
        for i, impl in enumerate(impls):
            xs, ys = [], []
            for j, (_, g) in enumerate(groups):
                r = next((x for x in g if x.impl == impl), None)
                if r is None or r.status not in ("ok", "anchor"):
                    continue
                t = r.main_s if column == "main" else (r.wall_s or r.cpu_s)
                if t:
                    xs.append(j + (i - (len(impls) - 1) / 2) * width)
                    ys.append(t * 1e6)
            if xs:
                any_bar = True
                ax.bar(
                    xs,
                    ys,
                    width,
                    label=impl,
                    color=colors[i % len(colors)],
                    hatch="//" if "anchor" in impl else None,
                )
        if not any_bar:
            plt.close(fig)
            continue
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([s for s, _ in groups], rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{device}: {title} (lower is better)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{suite}_time.png"
        fig.savefig(os.path.join(out_dir, name), dpi=120)
        plt.close(fig)
        made.append(name)
    return made, ""


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


# ---------------------------------------------------------------------------------------------
# Metadata and the command line
# ---------------------------------------------------------------------------------------------


def _git_commit(fs: Any) -> str | None:
    env = os.environ.get("FLASHSCAN_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(fs.__file__))
    for cwd in (here, os.getcwd()):
        try:
            rev = subprocess.run(
                ["git", "rev-parse", "--short=12", "HEAD"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if rev.returncode != 0 or not rev.stdout.strip():
                continue
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def _nvidia_smi_driver() -> str | None:
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("flashscan", "__main__.py")):
        argv = ["-m", "flashscan"] + argv[1:]
    return " ".join(shlex.quote(a) for a in ["python"] + argv)


def _slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", ""))
    return s.strip("-") or "gpu"


def collect_meta(torch: Any, fs: Any, device: Any, timer: Timer, quick: bool) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        info = dict(fs.info())
    triton_v = None
    with contextlib.suppress(Exception):
        import triton

        triton_v = triton.__version__
    cudnn_v = None
    with contextlib.suppress(Exception):
        cudnn_v = torch.backends.cudnn.version()
    driver = _nvidia_smi_driver()
    if info.get("driver_version") is not None:
        driver = f"{driver or '?'} (CUDA driver API {info['driver_version']})"
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "date": _dt.date.today().isoformat(),
        "date_utc": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": getattr(props, "multi_processor_count", None),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": driver,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn_v,
        "triton": triton_v,
        "python": platform.python_version(),
        "flashscan": getattr(fs, "__version__", None),
        "flashscan_file": os.path.abspath(fs.__file__),
        "flashscan_commit": _git_commit(fs),
        "flashscan_backend": (
            f"{info.get('backend')} (available: {info.get('available')}"
            + (f", reason: {info.get('reason')}" if info.get("reason") else "")
            + ")"
        )
        if info
        else None,
        "nvrtc": info.get("nvrtc_version"),
        "flashscan_info": info,
        "command": _command_line(),
        "timer": timer.description,
        "quick": quick,
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="flashscan bench",
        description="Time flashscan against every peer present (torch SDPA backends, flash-attn, "
        "mamba_ssm, plain torch, the NumPy reference) in one run on this GPU; write a markdown "
        "table, a JSON of raw numbers and PNG plots.",
    )
    p.add_argument("--quick", action="store_true", help="a subset that runs in about a minute")
    p.add_argument(
        "--suite",
        default="all",
        help="comma-separated suites: attention, latency, scan, state_update; 'all' (default) "
        "or 'none' (with --cold-start: only that)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: benches/results/<YYYY-MM-DD>-<gpu>[-quick]/)",
    )
    p.add_argument(
        "--cold-start",
        action="store_true",
        help="also time fresh processes from import to first correct result, with an empty "
        "and then a warm FLASHSCAN_CACHE_DIR",
    )
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument("--seed", type=int, default=0, help="torch random seed (default 0)")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.suite.split(",") if s.strip()]
    if names == ["all"]:
        args.suites = list(SUITES)
    elif names == ["none"]:
        args.suites = []
    else:
        bad = [n for n in names if n not in SUITES]
        if bad or not names:
            p.error(
                f"--suite: unknown {', '.join(bad) or 'empty'} (choose from "
                f"{', '.join(SUITES)}, all, none)"
            )
        args.suites = [s for s in SUITES if s in names]
    return args


def _log_to_stderr(start: float) -> Callable[[str], None]:
    def log(msg: str) -> None:
        line = f"[{time.perf_counter() - start:7.1f}s] {msg}"
        try:
            print(line, file=sys.stderr, flush=True)
        except UnicodeEncodeError:
            print(line.encode("ascii", "replace").decode("ascii"), file=sys.stderr, flush=True)

    return log


def _print_out(text: str) -> None:
    try:
        print(text, flush=True)
    except UnicodeEncodeError:
        print(text.encode("ascii", "replace").decode("ascii"), flush=True)


def main(argv: list[str] | None = None, *, results_root: str | None = None) -> int:
    """Run the harness; returns the process exit status (0; 1 when a flashscan row FAILED its
    correctness guard or raised; 130 when interrupted). `results_root` is where the default
    output directory goes (default: ./benches/results)."""
    args = _parse(argv)
    try:
        import torch
    except Exception as exc:
        _print_out(
            f"flashscan bench: torch is not importable ({type(exc).__name__}: {_first_line(exc)}); "
            "the harness times CUDA kernels on torch tensors, so there is nothing to do here."
        )
        return 0
    if not torch.cuda.is_available():
        _print_out(
            "flashscan bench: no CUDA GPU is visible (torch.cuda.is_available() is False); "
            "nothing to benchmark on this machine."
        )
        return 0
    import flashscan

    saved = os.environ.get("FLASHSCAN_FALLBACK")
    os.environ["FLASHSCAN_FALLBACK"] = "error"  # never time the host fallback by accident
    try:
        return _run(args, torch, flashscan, results_root)
    finally:
        if saved is None:
            os.environ.pop("FLASHSCAN_FALLBACK", None)
        else:
            os.environ["FLASHSCAN_FALLBACK"] = saved


def _run(args: argparse.Namespace, torch: Any, fs: Any, results_root: str | None) -> int:
    start = time.perf_counter()
    log = _log_to_stderr(start)
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)
    cfg = make_config(args.quick)
    timer = Timer(torch, device, cfg)
    meta = collect_meta(torch, fs, device, timer, args.quick)
    meta["seed"] = args.seed
    meta["suites"] = args.suites
    root = results_root or os.path.join(os.getcwd(), "benches", "results")
    out_dir = args.out or os.path.join(
        root, f"{meta['date']}-{_slug(meta['device'])}" + ("-quick" if args.quick else "")
    )
    fs_ok = False
    fs_reason = ""
    try:
        fs_ok = bool(fs.available())
        if not fs_ok:
            fs_reason = str(fs.info().get("reason") or "flashscan.available() is False")
    except Exception as exc:
        fs_reason = f"flashscan.available() raised {type(exc).__name__}: {_first_line(exc)}"
    log(
        f"device {meta['device']} (sm {meta['compute_capability']}), torch {torch.__version__}, "
        f"flashscan {meta['flashscan']} from {meta['flashscan_file']}"
    )
    if not fs_ok:
        log(
            f"WARNING: flashscan's CUDA backend is unavailable ({fs_reason}); its rows are "
            "skipped, the peers are still timed"
        )
    peers = _detect_peers()
    for name, (fn, why) in peers.items():
        log(f"peer {name}: " + ("found" if fn is not None else f"absent ({why})"))
    log(f"timer: {timer.description}")

    interrupted = False
    ceil = Ceilings()
    runner: Runner | None = None
    cold: list[dict[str, Any]] | None = None
    try:
        ceil = measure_ceilings(torch, device, timer, cfg, log)
        runner = Runner(torch, fs, device, cfg, timer, ceil, fs_ok, fs_reason, peers, log)
        for suite in args.suites:
            try:
                getattr(runner, f"run_{suite}")()
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # a bug here must not lose the other suites' rows
                msg = f"suite {suite} aborted: {type(exc).__name__}: {_first_line(exc)}"
                log(msg)
                meta.setdefault("errors", []).append(msg)
        if args.cold_start:
            cold = run_cold_start(fs, peers, log)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: writing what was measured so far")
    rows = runner.rows if runner is not None else []
    meta["interrupted"] = interrupted
    meta["elapsed_s"] = round(time.perf_counter() - start, 1)

    os.makedirs(out_dir, exist_ok=True)
    plots: list[str] = []
    if not args.no_plots:
        try:
            plots, why = write_plots(rows, out_dir, meta, ceil)
            if why:
                log(why)
        except Exception as exc:
            log(f"plots failed: {type(exc).__name__}: {_first_line(exc)}")
    report = render_markdown(meta, ceil, rows, cold, peers, plots)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    doc = {
        "meta": meta,
        "ceilings": dataclasses.asdict(ceil),
        "config": dataclasses.asdict(cfg),
        "peers": {
            k: {"present": fn is not None, "why_absent": why} for k, (fn, why) in peers.items()
        },
        "rows": [dataclasses.asdict(r) for r in rows],
        "cold_start": cold,
        "anchors": [
            {
                "suite": s,
                "shape": list(k),
                "seconds": t,
                "column": c,
                "what": w,
                "source": ANCHOR_LABEL,
            }
            for s, k, t, c, w in _ANCHORS
        ],
    }
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(_jsonable(doc), f, indent=1)
        f.write("\n")
    _print_out(report)
    log(f"wrote {out_dir}/results.md, results.json" + (", " + ", ".join(plots) if plots else ""))
    bad = [r for r in rows if r.kind == "flashscan" and r.status in ("FAILED", "error")]
    if bad:
        log(
            f"{len(bad)} flashscan row(s) FAILED or raised: "
            + "; ".join(f"{r.suite} {r.shape}: {r.status}" for r in bad[:5])
        )
    if interrupted:
        return 130
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
