#!/usr/bin/env python3
"""Dev harness for cuda/selective_scan_bwd.cu and the forward's saved states (not part of the package).

Builds the prelude and the params structs exactly as src/ops/scan_bwd.rs / src/ops/scan.rs do, launches
through the CUDA driver (tools/dev_scan.py's NVRTC + cuLaunchKernel helpers) on torch tensors, checks every
gradient against a float64 reference and times with triton.testing.do_bench.

    python3 tools/dev_scan_bwd.py compile      # no GPU: compile the variants, print regs/spills
    python3 tools/dev_scan_bwd.py test         # GPU: correctness matrix
    python3 tools/dev_scan_bwd.py bench        # GPU: timings
    python3 tools/dev_scan_bwd.py all
    compute-sanitizer --tool memcheck python3 tools/dev_scan_bwd.py sanitize

Reference: `ref_bwd_np` = the sequential backward written out by hand in NumPy float64; it is itself checked
against torch float64 autograd of a straightforward sequential scan (`ref_autograd_torch`) on several cases
in every test run. Low-precision baseline (DESIGN.md rule): the same sequential computation in float32 on
the same (rounded) inputs, the gradients that are stored in the input dtype (du, ddelta, dz) rounded to it:
what mamba_ssm's selective_scan_ref autograd does (it upcasts to fp32). Metric: max abs error; "rel" = max
abs error / max |reference| of that gradient (relative to the max-norm).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dev_scan as ds  # noqa: E402

DT_FP16, DT_BF16, DT_FP32 = ds.DT_FP16, ds.DT_BF16, ds.DT_FP32
SAVE_LEN = 256  # FS_CHUNK / FS_SAVE_LEN: saved-state spacing (src/ops/scan.rs SAVE_CHUNK)
BWD_THREADS = 128
SM_COUNT = 132
_cdiv = ds._cdiv


def saved_state_count(seqlen):
    return max(0, _cdiv(seqlen, SAVE_LEN) - 1)


# ----------------------------------------------------------------------------------------------- plan
def bwd_tiles(dstate, tune=None):
    dpad = ds._next_pow2(dstate)
    nsplit = min(max(dpad // 2, 1), 32)
    ns = dpad // nsplit
    tile = 4 if ns >= 8 else (8 if (ns == 4 or nsplit <= 2) else 16)
    # up to dstate 32: 256 threads, 2 blocks/SM (fastest measured, 8 B of spills at dstate 16); above: 128 / 3
    threads = 256 if dpad <= 32 else BWD_THREADS
    min_blocks = 2 if dpad <= 32 else 3
    tune = tune or {}
    nsplit = tune.get("nsplit", nsplit)
    tile = tune.get("tile", tile)
    threads = tune.get("threads", threads)
    min_blocks = tune.get("min_blocks", min_blocks)
    return dict(
        dpad=dpad,
        nsplit=nsplit,
        ns=dpad // nsplit,
        tile=tile,
        threads=threads,
        min_blocks=min_blocks,
    )


def plan_bwd(
    batch,
    dim,
    seqlen,
    dstate,
    ngroups,
    in_dt,
    bc_dt,
    bv,
    cv,
    have_saved,
    sm_count=SM_COUNT,
    tune=None,
):
    t = bwd_tiles(dstate, tune)
    chans = t["threads"] // t["nsplit"]
    dpg = dim // ngroups
    if (bv or cv) and ngroups > 1:
        cpb = max(c for c in range(1, min(chans, dpg) + 1) if dpg % c == 0)
    else:
        cpb = chans
    nblk_d = _cdiv(dim, cpb)
    nitems = batch * nblk_d
    grid = min(nitems, sm_count * t["min_blocks"])
    row = t["dpad"] + 4 if t["dpad"] >= 4 else t["dpad"]
    T = t["tile"]
    floats = (
        (int(bv) + int(cv)) * T * row
        + 4 * chans * T
        + t["threads"] * 3 * (T + 2)
        + (t["threads"] // 32 * 2 * t["dpad"] * (T + 1) if (bv or cv) else 0)
    )
    nsaved = saved_state_count(seqlen)
    defines = dict(
        FS_IN_DTYPE=in_dt,
        FS_BC_DTYPE=bc_dt,
        FS_DSTATE=t["dpad"],
        FS_NSPLIT=t["nsplit"],
        FS_TILE_T=T,
        FS_THREADS=t["threads"],
        FS_MIN_BLOCKS=t["min_blocks"],
        FS_B_VARYING=int(bv),
        FS_C_VARYING=int(cv),
        FS_CHUNK=SAVE_LEN,
        FS_ARCH=90,
    )
    launches = [("selective_scan_bwd_zero", (min(1024, sm_count * 4), 1, 1), (256, 1, 1), 0)]
    if nsaved > 0 and not have_saved:
        launches.append(
            ("selective_scan_bwd_states", (nitems, 1, 1), (t["threads"], 1, 1), 4 * floats)
        )
    launches.append(("selective_scan_bwd", (grid, 1, 1), (t["threads"], 1, 1), 4 * floats))
    return dict(
        defines=defines,
        chans_per_block=cpb,
        nitems=nitems,
        grid=grid,
        smem=4 * floats,
        nsaved=nsaved,
        ck_floats=grid * (SAVE_LEN // T) * t["threads"] * t["ns"],
        launches=launches,
    )


# ----------------------------------------------------------------------------------------------- params
class ScanParamsSave(ctypes.Structure):
    _fields_ = (
        list(ds.ScanParams._fields_)
        + [("saved", ctypes.c_uint64)]
        + [(n, ctypes.c_int64) for n in ("saved_batch", "saved_dim", "saved_chunk", "saved_dstate")]
    )


_P = [
    "u",
    "delta",
    "A",
    "B",
    "C",
    "D",
    "delta_bias",
    "z",
    "initial_state",
    "dout",
    "saved",
    "dlast",
    "du",
    "ddelta",
    "dA",
    "dB",
    "dC",
    "dD",
    "dz",
    "ddelta_bias",
    "dinit",
    "ck",
]
_I64 = (
    "batch dim seqlen dstate ngroups nsaved "
    "u_batch u_dim delta_batch delta_dim z_batch z_dim dout_batch dout_dim "
    "du_batch du_dim ddelta_batch ddelta_dim dz_batch dz_dim A_dim A_dstate "
    "B_batch B_group B_dstate B_dim C_batch C_group C_dstate C_dim "
    "D_dim delta_bias_dim init_batch init_dim init_dstate "
    "saved_batch saved_dim saved_chunk saved_dstate dlast_batch dlast_dim dlast_dstate dA_dim dA_dstate "
    "dB_batch dB_group dB_dstate dB_dim dC_batch dC_group dC_dstate dC_dim "
    "dD_dim ddelta_bias_dim dinit_batch dinit_dim dinit_dstate"
).split()
_I32 = (
    "chans_per_block nitems has_D has_z has_delta_bias softplus has_initial_state has_saved has_dlast io_align"
).split()


class ScanBwdParams(ctypes.Structure):
    _fields_ = (
        [(n, ctypes.c_uint64) for n in _P]
        + [(n, ctypes.c_int64) for n in _I64]
        + [("zero_n", ctypes.c_int64 * 5)]
        + [(n, ctypes.c_int32) for n in _I32]
    )


assert ctypes.sizeof(ScanParamsSave) == 440, ctypes.sizeof(ScanParamsSave)
assert ctypes.sizeof(ScanBwdParams) == 712, ctypes.sizeof(ScanBwdParams)


# ----------------------------------------------------------------------------------------------- launchers
def _torch():
    import torch

    return torch


def _gv(X):
    return X.unsqueeze(1) if X.dim() == 3 else X


def forward(
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    softplus=False,
    initial_state=None,
    out=None,
    saved=None,
    nchunks=None,
    keep=None,
):
    """The forward (selective_scan.cu) with optional state saving (FS_SAVE_STATES=1 variant)."""
    torch = _torch()
    batch, dim, seqlen = u.shape
    dstate = A.shape[1]
    b_var, c_var = B.dim() >= 3, C.dim() >= 3
    Bv = _gv(B) if b_var else B
    Cv = _gv(C) if c_var else C
    ngroups = Bv.shape[1] if b_var else (Cv.shape[1] if c_var else 1)
    in_dt = ds._dt_code(u)
    bc_dt = ds._dt_code(B)
    plan = ds.plan_scan(
        batch, dim, seqlen, dstate, ngroups, in_dt, bc_dt, b_var, c_var, nchunks=nchunks
    )
    defines = dict(plan["defines"])
    if saved is not None:
        defines["FS_SAVE_STATES"] = 1
        defines["FS_SAVE_LEN"] = SAVE_LEN
    out = torch.empty_like(u) if out is None else out
    nch = plan["nchunks"]
    cs = dsum = None
    if nch > 1:
        cs = torch.empty(max(plan["scratch_chunk_state"], 1), device=u.device, dtype=torch.float32)
        dsum = torch.empty(
            max(plan["scratch_chunk_dtsum"], 1), device=u.device, dtype=torch.float32
        )
    p = ScanParamsSave() if saved is not None else ds.ScanParams()
    ptr = lambda t: 0 if t is None else t.data_ptr()
    p.u, p.delta, p.A, p.B, p.C = ptr(u), ptr(delta), ptr(A), ptr(Bv), ptr(Cv)
    p.D, p.delta_bias, p.z, p.out = ptr(D), ptr(delta_bias), ptr(z), ptr(out)
    p.initial_state, p.last_state = ptr(initial_state), 0
    p.chunk_state, p.chunk_dtsum = ptr(cs), ptr(dsum)
    p.batch, p.dim, p.seqlen, p.dstate, p.ngroups, p.chunk_len = (
        batch,
        dim,
        seqlen,
        dstate,
        ngroups,
        plan["chunk_len"],
    )
    p.u_batch, p.u_dim = u.stride(0), u.stride(1)
    p.delta_batch, p.delta_dim = delta.stride(0), delta.stride(1)
    if z is not None:
        p.z_batch, p.z_dim = z.stride(0), z.stride(1)
    p.out_batch, p.out_dim = out.stride(0), out.stride(1)
    p.A_dim, p.A_dstate = A.stride(0), A.stride(1)
    if b_var:
        p.B_batch, p.B_group, p.B_dstate = Bv.stride(0), Bv.stride(1), Bv.stride(2)
    else:
        p.B_dim, p.B_dstate = B.stride(0), B.stride(1)
    if c_var:
        p.C_batch, p.C_group, p.C_dstate = Cv.stride(0), Cv.stride(1), Cv.stride(2)
    else:
        p.C_dim, p.C_dstate = C.stride(0), C.stride(1)
    if D is not None:
        p.D_dim = D.stride(0)
    if delta_bias is not None:
        p.delta_bias_dim = delta_bias.stride(0)
    if initial_state is not None:
        p.init_batch, p.init_dim, p.init_dstate = initial_state.stride()
    p.nchunks, p.chans_per_block = nch, plan["chans_per_block"]
    p.has_D, p.has_z, p.has_delta_bias = (
        int(D is not None),
        int(z is not None),
        int(delta_bias is not None),
    )
    p.softplus = int(bool(softplus))
    p.has_initial_state, p.has_last_state = int(initial_state is not None), 0
    p.io_align = ds._align_bytes(
        (u, u.stride()[:2]),
        (delta, delta.stride()[:2]),
        (z, z.stride()[:2] if z is not None else ()),
        (out, out.stride()[:2]),
    )
    if saved is not None:
        p.saved = saved.data_ptr()
        p.saved_batch, p.saved_dim, p.saved_chunk, p.saved_dstate = saved.stride()
    stream = torch.cuda.current_stream().cuda_stream
    for entry, grid, block, smem in plan["launches"]:
        f = ds.get_function("selective_scan.cu", defines, entry, smem)
        ds.launch(f, grid, block, smem, p, stream)
    if keep is not None:
        keep.append((cs, dsum, p))
    return out


def backward(
    u,
    delta,
    A,
    B,
    C,
    D,
    z,
    delta_bias,
    softplus,
    initial_state,
    dout,
    saved,
    dlast,
    du,
    ddelta,
    dA,
    dB,
    dC,
    dD,
    dz,
    ddelta_bias,
    dinit,
    tune=None,
    keep=None,
):
    """The backward launch sequence of src/ops/scan_bwd.rs. Gradient outputs are given (poisoned by the caller)."""
    torch = _torch()
    batch, dim, seqlen = u.shape
    dstate = A.shape[1]
    b_var, c_var = B.dim() >= 3, C.dim() >= 3
    Bv = _gv(B) if b_var else B
    Cv = _gv(C) if c_var else C
    dBv = _gv(dB) if b_var else dB
    dCv = _gv(dC) if c_var else dC
    ngroups = Bv.shape[1] if b_var else (Cv.shape[1] if c_var else 1)
    plan = plan_bwd(
        batch,
        dim,
        seqlen,
        dstate,
        ngroups,
        ds._dt_code(u),
        ds._dt_code(B),
        b_var,
        c_var,
        saved is not None,
        tune=tune,
    )
    ck = torch.empty(max(plan["ck_floats"], 1), device=u.device, dtype=torch.float32)
    sv = saved
    if plan["nsaved"] > 0 and saved is None:
        sv = torch.empty(batch, dim, plan["nsaved"], dstate, device=u.device, dtype=torch.float32)
    p = ScanBwdParams()
    ptr = lambda t: 0 if t is None else t.data_ptr()
    for n, t in (
        ("u", u),
        ("delta", delta),
        ("A", A),
        ("B", Bv),
        ("C", Cv),
        ("D", D),
        ("delta_bias", delta_bias),
        ("z", z),
        ("initial_state", initial_state),
        ("dout", dout),
        ("saved", sv),
        ("dlast", dlast),
        ("du", du),
        ("ddelta", ddelta),
        ("dA", dA),
        ("dB", dBv),
        ("dC", dCv),
        ("dD", dD),
        ("dz", dz),
        ("ddelta_bias", ddelta_bias),
        ("dinit", dinit),
        ("ck", ck),
    ):
        setattr(p, n, ptr(t))
    p.batch, p.dim, p.seqlen, p.dstate, p.ngroups, p.nsaved = (
        batch,
        dim,
        seqlen,
        dstate,
        ngroups,
        plan["nsaved"],
    )
    for n, t in (
        ("u", u),
        ("delta", delta),
        ("z", z),
        ("dout", dout),
        ("du", du),
        ("ddelta", ddelta),
        ("dz", dz),
    ):
        if t is not None:
            setattr(p, n + "_batch", t.stride(0))
            setattr(p, n + "_dim", t.stride(1))
    p.A_dim, p.A_dstate = A.stride()
    p.dA_dim, p.dA_dstate = dA.stride()
    for n, X, v in (("B", Bv, b_var), ("C", Cv, c_var), ("dB", dBv, b_var), ("dC", dCv, c_var)):
        if v:
            setattr(p, n + "_batch", X.stride(0))
            setattr(p, n + "_group", X.stride(1))
            setattr(p, n + "_dstate", X.stride(2))
        else:
            setattr(p, n + "_dim", X.stride(0))
            setattr(p, n + "_dstate", X.stride(1))
    if D is not None:
        p.D_dim, p.dD_dim = D.stride(0), dD.stride(0)
    if delta_bias is not None:
        p.delta_bias_dim, p.ddelta_bias_dim = delta_bias.stride(0), ddelta_bias.stride(0)
    if initial_state is not None:
        p.init_batch, p.init_dim, p.init_dstate = initial_state.stride()
        p.dinit_batch, p.dinit_dim, p.dinit_dstate = dinit.stride()
    if sv is not None:
        p.saved_batch, p.saved_dim, p.saved_chunk, p.saved_dstate = sv.stride()
    if dlast is not None:
        p.dlast_batch, p.dlast_dim, p.dlast_dstate = dlast.stride()
    for i, t in enumerate((dA, dB, dC, dD, ddelta_bias)):
        p.zero_n[i] = 0 if t is None else t.numel()
    p.chans_per_block, p.nitems = plan["chans_per_block"], plan["nitems"]
    p.has_D, p.has_z, p.has_delta_bias = (
        int(D is not None),
        int(z is not None),
        int(delta_bias is not None),
    )
    p.softplus = int(bool(softplus))
    p.has_initial_state, p.has_saved, p.has_dlast = (
        int(initial_state is not None),
        int(sv is not None),
        int(dlast is not None),
    )
    p.io_align = ds._align_bytes(
        *[(t, t.stride()[:2]) for t in (u, delta, z, dout, du, ddelta, dz) if t is not None]
    )
    stream = torch.cuda.current_stream().cuda_stream
    for entry, grid, block, smem in plan["launches"]:
        f = ds.get_function("selective_scan_bwd.cu", plan["defines"], entry, smem)
        ds.launch(f, grid, block, smem, p, stream)
    if keep is not None:
        keep.append((ck, sv, p))
    return plan


# ----------------------------------------------------------------------------------------------- references
def _sp(v):
    return np.where(v <= 20, np.log1p(np.exp(np.minimum(v, 20))), v)


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def ref_bwd_np(u, delta, A, B, C, D, z, bias, softplus, init, dout, dlast, dtype=np.float64):
    """Sequential forward + hand-written backward. Returns dict of gradients (and out, last)."""
    f = lambda a: None if a is None else np.asarray(a, dtype=dtype)
    u, delta, A, B, C, D, z, bias, init, dout, dlast = map(
        f, (u, delta, A, B, C, D, z, bias, init, dout, dlast)
    )
    batch, dim, L = u.shape
    n = A.shape[1]
    v = delta + (bias[None, :, None] if bias is not None else 0)
    dt = _sp(v) if softplus else v

    def form(X):
        if X.ndim == 2:
            return "fixed", 1
        if X.ndim == 3:
            return "var3", 1
        return "var4", X.shape[1]

    def at(X, t):  # -> (batch, dim, n) or (dim, n)
        if X.ndim == 2:
            return X
        X4 = X[:, None] if X.ndim == 3 else X
        g = X4.shape[1]
        return np.repeat(X4[:, :, :, t], dim // g, axis=1)

    def reduce_to(X, vals, t, acc):  # vals (batch, dim, n) summed into acc of X's shape at step t
        if X.ndim == 2:
            acc += vals.sum(0)
        else:
            g = 1 if X.ndim == 3 else X.shape[1]
            r = vals.reshape(batch, g, dim // g, n).sum(2)
            if X.ndim == 3:
                acc[:, :, t] += r[:, 0]
            else:
                acc[:, :, :, t] += r

    xs = np.zeros((L + 1, batch, dim, n), dtype)
    if init is not None:
        xs[0] = init
    aa = np.exp(dt[..., None] * A[None, :, None, :])  # (b, d, L, n)
    dtu = dt * u
    for t in range(L):
        xs[t + 1] = aa[:, :, t] * xs[t] + dtu[:, :, t, None] * at(B, t)
    y = np.empty((batch, dim, L), dtype)
    for t in range(L):
        y[:, :, t] = (xs[t + 1] * at(C, t)).sum(-1)
    if D is not None:
        y = y + D[None, :, None] * u
    if z is not None:
        sz = _sig(z)
        dy = dout * z * sz
        dz = dout * y * sz * (1 + z * (1 - sz))
    else:
        dy, dz = dout, None
    carry = np.zeros((batch, dim, n), dtype) if dlast is None else dlast.copy()
    du = np.empty_like(u)
    ddt = np.empty_like(u)
    dA = np.zeros_like(A)
    dB = np.zeros_like(B)
    dC = np.zeros_like(C)
    for t in range(L - 1, -1, -1):
        Bt, Ct = at(B, t), at(C, t)
        g = carry + dy[:, :, t, None] * Ct
        w = g * aa[:, :, t] * xs[t]
        S1 = (g * Bt).sum(-1)
        S2 = (w * A[None]).sum(-1)
        du[:, :, t] = dt[:, :, t] * S1
        ddt[:, :, t] = u[:, :, t] * S1 + S2
        dA += (dt[:, :, t, None] * w).sum(0)
        reduce_to(B, g * dtu[:, :, t, None], t, dB)
        reduce_to(C, dy[:, :, t, None] * xs[t + 1], t, dC)
        carry = aa[:, :, t] * g
    if D is not None:
        du = du + D[None, :, None] * dy
    ddelta = ddt * np.where(v <= 20, _sig(v), 1.0) if softplus else ddt
    out = y * (z * _sig(z)) if z is not None else y
    return dict(
        du=du,
        ddelta=ddelta,
        dA=dA,
        dB=dB,
        dC=dC,
        dD=(dy * u).sum((0, 2)) if D is not None else None,
        dz=dz,
        ddelta_bias=ddelta.sum((0, 2)) if bias is not None else None,
        dinit=carry if init is not None else None,
        out=out,
        last=xs[L],
    )


def ref_autograd_torch(inp, dout, dlast, softplus):
    """torch float64 autograd of a straightforward sequential scan (CPU). Returns dict of gradients."""
    torch = _torch()
    T = {
        k: (None if v is None else v.detach().double().cpu().requires_grad_(True))
        for k, v in inp.items()
    }
    u, delta, A, B, C, D, z, bias, init = (
        T[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
    )
    batch, dim, L = u.shape
    v = delta + (bias[None, :, None] if bias is not None else 0)
    dt = torch.nn.functional.softplus(v) if softplus else v

    def at(X, t):
        if X.dim() == 2:
            return X
        X4 = X.unsqueeze(1) if X.dim() == 3 else X
        return X4[:, :, :, t].repeat_interleave(dim // X4.shape[1], dim=1)

    x = init if init is not None else torch.zeros(batch, dim, A.shape[1], dtype=torch.float64)
    ys = []
    for t in range(L):
        x = torch.exp(dt[:, :, t, None] * A) * x + (dt[:, :, t] * u[:, :, t])[..., None] * at(B, t)
        ys.append((x * at(C, t)).sum(-1))
    y = torch.stack(ys, -1)
    if D is not None:
        y = y + D[None, :, None] * u
    if z is not None:
        y = y * torch.nn.functional.silu(z)
    loss = (y * dout.double().cpu()).sum()
    if dlast is not None:
        loss = loss + (x * dlast.double().cpu()).sum()
    loss.backward()
    names = dict(
        u="du",
        delta="ddelta",
        A="dA",
        B="dB",
        C="dC",
        D="dD",
        z="dz",
        delta_bias="ddelta_bias",
        initial_state="dinit",
    )
    return {names[k]: (None if t is None else t.grad.numpy()) for k, t in T.items()}


# ----------------------------------------------------------------------------------------------- tests
LOWP_GRADS = ("du", "ddelta", "dz")


def _np(t):
    return t.detach().double().cpu().numpy()


def judge_grads(res, name, got, ref, base, code):
    """got: dict of torch tensors; ref/base: dicts of float64 arrays (base None for fp32)."""
    ok_all, worst, msgs = True, 0.0, []
    for k, g in got.items():
        if g is None:
            continue
        o = _np(g)
        r = ref[k]
        if not np.isfinite(o).all():
            ok_all = False
            msgs.append(f"{k}: {int((~np.isfinite(o)).sum())} non-finite")
            continue
        err = float(np.abs(o - r).max()) if o.size else 0.0
        scale = max(float(np.abs(r).max()) if o.size else 0.0, 1e-30)
        rel = err / scale
        if code == DT_FP32:
            ok = rel < 1e-4
            ratio = rel / 1e-4
            msgs.append(f"{k}:{rel:.1e}")
        else:
            b = base[k]
            if k in LOWP_GRADS:
                b = ds._round_to(b, code)
            berr = float(np.abs(b - r).max()) if o.size else 0.0
            if k in LOWP_GRADS:
                bound = 2 * berr + 1e-5 * scale
            else:  # stored in f32: 2x the fp32 computation's error, or the fp32 rule (1e-4 of the max-norm)
                bound = max(2 * berr, 1e-4 * scale) + 1e-6 * scale
            ok = err <= bound
            ratio = err / max(2 * berr, 1e-30)
            msgs.append(f"{k}:{err:.1e}/{bound:.1e}(x{ratio:.2f})")
        worst = max(worst, ratio if np.isfinite(ratio) else 0)
        ok_all = ok_all and ok
    res.add(name, ok_all, f"worst={worst:.2f} " + " ".join(msgs))
    return worst


WORST = {}


def run_bwd_case(
    res,
    name,
    batch,
    dim,
    seqlen,
    dstate,
    code,
    bc_code,
    b_form,
    c_form,
    ngroups=1,
    softplus=True,
    has_D=True,
    has_z=True,
    has_bias=True,
    has_init=False,
    has_dlast=False,
    use_saved=True,
    pad_rows=0,
    seed=0,
    tune=None,
    check_autograd=False,
    fwd_nchunks=None,
):
    torch = _torch()
    inp = ds.make_scan_inputs(
        batch,
        dim,
        seqlen,
        dstate,
        code,
        bc_code,
        b_form,
        c_form,
        ngroups,
        has_D,
        has_z,
        has_bias,
        has_init,
        seed,
        pad_rows,
    )
    g = torch.Generator(device="cpu").manual_seed(seed + 1000)
    dt_ = ds._tdt(code)
    dout = torch.randn(batch, dim, seqlen + pad_rows, generator=g).to(dt_).cuda()[:, :, :seqlen]
    dlast = torch.randn(batch, dim, dstate, generator=g).cuda() if has_dlast else None
    nsaved = saved_state_count(seqlen)
    saved = None
    if use_saved and nsaved > 0:
        saved = torch.full((batch, dim, nsaved, dstate), float("nan"), device="cuda")
        forward(
            inp["u"],
            inp["delta"],
            inp["A"],
            inp["B"],
            inp["C"],
            inp["D"],
            inp["z"],
            inp["delta_bias"],
            softplus,
            inp["initial_state"],
            saved=saved,
            nchunks=fwd_nchunks,
        )
    nan = float("nan")

    def lowp_like(t):
        return torch.full((batch, dim, seqlen + pad_rows), nan, dtype=t.dtype, device="cuda")[
            :, :, :seqlen
        ]

    du, ddelta = lowp_like(inp["u"]), lowp_like(inp["delta"])
    dz = lowp_like(inp["z"]) if has_z else None
    f32 = lambda t: (
        None if t is None else torch.full(t.shape, nan, device="cuda", dtype=torch.float32)
    )
    dA, dB, dC = f32(inp["A"]), f32(inp["B"]), f32(inp["C"])
    dD, dbias, dinit = f32(inp["D"]), f32(inp["delta_bias"]), f32(inp["initial_state"])
    plan = backward(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        inp["D"],
        inp["z"],
        inp["delta_bias"],
        softplus,
        inp["initial_state"],
        dout,
        saved,
        dlast,
        du,
        ddelta,
        dA,
        dB,
        dC,
        dD,
        dz,
        dbias,
        dinit,
        tune=tune,
    )
    torch.cuda.synchronize()
    npi = {k: (None if v is None else _np(v)) for k, v in inp.items()}
    args = (
        npi["u"],
        npi["delta"],
        npi["A"],
        npi["B"],
        npi["C"],
        npi["D"],
        npi["z"],
        npi["delta_bias"],
        softplus,
        npi["initial_state"],
        _np(dout),
        None if dlast is None else _np(dlast),
    )
    ref = ref_bwd_np(*args)
    base = ref_bwd_np(*args, dtype=np.float32) if code != DT_FP32 else None
    if base is not None:
        base = {k: (None if v is None else np.asarray(v, np.float64)) for k, v in base.items()}
    got = dict(
        du=du, ddelta=ddelta, dA=dA, dB=dB, dC=dC, dD=dD, dz=dz, ddelta_bias=dbias, dinit=dinit
    )
    extra = ""
    if saved is not None:  # the forward's saved states vs the reference states
        sv = _np(saved)
        x_ref = (
            np.stack([_ref_state_at(npi, softplus, (c + 1) * SAVE_LEN) for c in range(nsaved)], 2)
            if nsaved <= 4
            else None
        )
        if x_ref is not None:
            serr = np.abs(sv - x_ref).max() / max(np.abs(x_ref).max(), 1e-30)
            extra = f" saved_rel={serr:.1e}"
            if not (np.isfinite(sv).all() and serr < 1e-4):
                res.add(f"saved-states {name}", False, extra)
    if check_autograd:  # the NumPy reference itself vs torch float64 autograd
        ag = ref_autograd_torch(inp, dout, dlast, softplus)
        d = max(
            float(np.abs(ag[k] - ref[k]).max() / max(np.abs(ag[k]).max(), 1e-30))
            for k in ag
            if ag[k] is not None
        )
        extra += f" np-ref-vs-autograd={d:.1e}"
        if d > 1e-9:
            res.add(f"np-reference {name}", False, f"{d:.1e}")
    label = (
        f"bwd {name} {tune or ''}[b{batch} d{dim} L{seqlen} n{dstate} {ds.DT_NAMES[code]}/{ds.DT_NAMES[bc_code]}"
        f" B:{b_form} C:{c_form} g{ngroups} sp{int(softplus)} D{int(has_D)} z{int(has_z)} bias{int(has_bias)}"
        f" init{int(has_init)} dlast{int(has_dlast)} saved{int(saved is not None)}"
        f" split{plan['defines']['FS_NSPLIT']} T{plan['defines']['FS_TILE_T']}]{extra}"
    )
    w = judge_grads(res, label, got, ref, base, code)
    key = ds.DT_NAMES[code]
    WORST[key] = max(WORST.get(key, 0), w)


def _ref_state_at(npi, softplus, L):
    y, x = ds.ref_scan_np(
        npi["u"][:, :, :L],
        npi["delta"][:, :, :L],
        npi["A"],
        npi["B"] if npi["B"].ndim == 2 else npi["B"][..., :L],
        npi["C"] if npi["C"].ndim == 2 else npi["C"][..., :L],
        D=npi["D"],
        z=None,
        delta_bias=npi["delta_bias"],
        softplus=softplus,
        initial_state=npi["initial_state"],
    )
    return x


def test_matrix(quick=False):
    F, H, BF = DT_FP32, DT_FP16, DT_BF16
    cases = []
    S = lambda name, *a, **k: cases.append((name, a, k))
    S(
        "autograd-check",
        2,
        24,
        37,
        16,
        F,
        F,
        "var4",
        "var4",
        has_init=True,
        has_dlast=True,
        check_autograd=True,
    )
    S("autograd-check-fixed", 1, 16, 20, 4, F, F, "fixed", "var3", ngroups=1, check_autograd=True)
    S(
        "autograd-check-g2",
        2,
        8,
        9,
        3,
        F,
        F,
        "var4",
        "fixed",
        ngroups=2,
        has_init=True,
        check_autograd=True,
    )
    for code in (F, H, BF):
        for bc in sorted({F, code}):
            S("dtypes", 2, 96, 60, 16, code, bc, "var4", "var4", has_init=True, has_dlast=True)
    for code in (F, BF):
        S("fixed-BC", 2, 64, 60, 16, code, F, "fixed", "fixed", has_init=True)
        S("fixed-B", 2, 64, 61, 16, code, code, "fixed", "var3")
        S("fixed-C", 2, 64, 61, 16, code, F, "var3", "fixed")
        S("var3", 3, 40, 77, 16, code, code, "var3", "var3")
        S("ngroups2", 2, 128, 100, 16, code, F, "var4", "var4", ngroups=2)
        S("ngroups3-odd", 2, 21, 50, 16, code, code, "var4", "fixed", ngroups=3)
        S("odd-dim", 2, 37, 33, 16, code, F, "var4", "var4")
        S(
            "noopts",
            2,
            64,
            70,
            16,
            code,
            code,
            "var4",
            "var4",
            softplus=False,
            has_D=False,
            has_z=False,
            has_bias=False,
        )
        S(
            "D-only",
            1,
            64,
            31,
            16,
            code,
            F,
            "var4",
            "var4",
            softplus=False,
            has_z=False,
            has_bias=False,
        )
        S(
            "z-only",
            1,
            64,
            31,
            16,
            code,
            F,
            "var4",
            "var4",
            softplus=False,
            has_D=False,
            has_bias=False,
        )
        S("unaligned", 2, 48, 61, 16, code, code, "var4", "var4", pad_rows=1)
    S("fp16-opts", 2, 48, 100, 16, H, H, "var3", "fixed", has_init=True, has_dlast=True)
    for n in (1, 4, 16, 64, 256):
        for code in (F, BF):
            S(f"dstate{n}", 2, 48, 70, n, code, F, "var4", "var4", has_init=True, has_dlast=True)
            S(f"dstate{n}-fixed", 1, 48, 45, n, code, code, "fixed", "fixed", has_init=True)
            S(
                f"dstate{n}-chunks",
                1,
                24,
                600,
                n,
                code,
                code,
                "var4",
                "var3",
                has_init=True,
                has_dlast=True,
            )
    for n in (2, 3, 8, 10, 32, 100):
        S(f"dstate{n}", 1, 40, 300, n, H, F, "var4", "var4", has_init=True, has_dlast=True)
    for L in (1, 2, 7, 60, 64, 2047, 4096):
        S(f"seqlen{L}", 2, 64, L, 16, BF, F, "var4", "var4", has_init=True, has_dlast=True)
        S(f"seqlen{L}-fp32", 1, 64, L, 16, F, F, "var4", "var4", has_init=True)
        S(f"seqlen{L}-fp16", 1, 32, L, 16, H, H, "var4", "fixed")
    S(
        "seqlen4096-recompute",
        1,
        64,
        4096,
        16,
        BF,
        BF,
        "var4",
        "var4",
        has_init=True,
        use_saved=False,
    )
    S("seqlen2047-recompute-fp32", 1, 40, 2047, 16, F, F, "fixed", "var4", use_saved=False)
    S("seqlen3001-fwdchunked", 1, 64, 3001, 16, F, F, "var4", "var4", has_init=True, fwd_nchunks=5)
    S("seqlen100000", 1, 8, 100000, 16, F, F, "var4", "var4", has_init=True, has_dlast=True)
    S("seqlen100000-bf16", 1, 8, 100000, 4, BF, F, "var4", "fixed")
    if quick:
        cases = [c for c in cases if "100000" not in c[0]]
    return cases


def run_tests(quick=False):
    res = ds.Results()
    t0 = time.time()
    for name, a, k in test_matrix(quick):
        try:
            run_bwd_case(res, name, *a, **k)
        except Exception as e:
            import traceback

            traceback.print_exc()
            res.add(f"bwd {name}", False, f"exception {type(e).__name__}: {e}")
    print(
        f"\n{len(res.rows) - res.fails} passed, {res.fails} failed  ({time.time() - t0:.1f} s)",
        flush=True,
    )
    print(
        "worst error ratio (ours / (2 x baseline) for fp16/bf16; rel/1e-4 for fp32):",
        {k: round(v, 3) for k, v in WORST.items()},
        flush=True,
    )
    return res


def run_sanitize_cases():
    res = ds.Results()
    F, H, BF = DT_FP32, DT_FP16, DT_BF16
    run_bwd_case(res, "san", 1, 40, 300, 16, BF, F, "var4", "var4", has_init=True, has_dlast=True)
    run_bwd_case(
        res, "san-recompute", 1, 20, 600, 16, F, F, "var4", "fixed", use_saved=False, has_init=True
    )
    run_bwd_case(res, "san-fixed", 1, 37, 33, 16, BF, BF, "fixed", "fixed", pad_rows=1)
    run_bwd_case(res, "san-n256", 1, 9, 40, 256, F, F, "var4", "var4")
    run_bwd_case(res, "san-n1", 1, 20, 40, 1, H, F, "var4", "fixed")
    run_bwd_case(res, "san-n64-g", 1, 20, 70, 64, BF, BF, "var4", "var4", ngroups=2)
    print(f"{len(res.rows) - res.fails} passed, {res.fails} failed", flush=True)
    return res


# ----------------------------------------------------------------------------------------------- bench
def bench(rows, name, batch, dim, seqlen, dstate, code, anchor_us=None, tune=None):
    import triton.testing as tt

    torch = _torch()
    inp = ds.make_scan_inputs(
        batch, dim, seqlen, dstate, code, code, "var3", "var3", 1, on_gpu=True
    )
    dout = torch.randn(batch, dim, seqlen, device="cuda").to(ds._tdt(code))
    nsaved = saved_state_count(seqlen)
    saved = torch.empty(batch, dim, nsaved, dstate, device="cuda") if nsaved else None
    out = torch.empty_like(inp["u"])
    keep = []
    fwd_off = lambda: forward(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        inp["D"],
        inp["z"],
        inp["delta_bias"],
        True,
        out=out,
        keep=keep,
    )
    fwd_on = lambda: forward(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        inp["D"],
        inp["z"],
        inp["delta_bias"],
        True,
        out=out,
        saved=saved,
        keep=keep,
    )
    du, ddelta, dz = (torch.empty_like(inp["u"]) for _ in range(3))
    f32 = lambda t: torch.empty(t.shape, device="cuda")
    dA, dB, dC, dD, dbias = (f32(inp[k]) for k in ("A", "B", "C", "D", "delta_bias"))
    fwd_on()

    def bwd(sv):
        backward(
            inp["u"],
            inp["delta"],
            inp["A"],
            inp["B"],
            inp["C"],
            inp["D"],
            inp["z"],
            inp["delta_bias"],
            True,
            None,
            dout,
            sv,
            None,
            du,
            ddelta,
            dA,
            dB,
            dC,
            dD,
            dz,
            dbias,
            None,
            tune=tune,
            keep=keep,
        )

    if GRAPH_TIMING:  # GPU time only: median over CUDA-graph replays (the ctypes launcher costs ~50-100 us of host time)
        big = batch * dim * seqlen > 1e8
        tm = lambda fn: ds.gpu_time_us(fn, n_inner=3 if big else 20, reps=5)
    else:  # triton.testing.do_bench medians (host launch overhead included for small shapes)
        tm = lambda fn: tt.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    t_off = tm(fwd_off)
    t_on = tm(fwd_on)
    t_b = tm(lambda: bwd(saved))
    t_r = tm(lambda: bwd(None)) if nsaved else t_b
    keep.clear()
    es = ds.DT_BYTES[code]
    nbytes = batch * dim * seqlen * es * 7 + batch * dstate * seqlen * (2 * es + 8)
    t_mem = nbytes / 3.0e12 * 1e6
    t_exp = 2 * batch * dim * seqlen * dstate / (16 * 132 * 1.755e9) * 1e6
    row = (
        f"{name:<34s} bwd {t_b:8.1f} us (recompute states {t_r:8.1f})  fwd save off {t_off:7.1f} on {t_on:7.1f} us"
        f"  floor mem {t_mem:.0f} us, 2 exp {t_exp:.0f} us"
        + (f"  mamba {anchor_us} us -> {anchor_us / t_b:.2f}x" if anchor_us else "")
        + f" {tune or ''}"
    )
    print(row, flush=True)
    rows.append(row)


GRAPH_TIMING = os.environ.get("FS_GRAPH_TIMING", "1") == "1"
BENCH_TUNES = (None, dict(threads=128, min_blocks=3))


def run_bench():
    rows = []
    BF = DT_BF16
    bench(rows, "b8 d2048 L2048 bf16 n16", 8, 2048, 2048, 16, BF, anchor_us=2410)
    bench(rows, "b8 d2048 L8192 bf16 n16", 8, 2048, 8192, 16, BF, anchor_us=9500)
    bench(rows, "game b32 d512 L60 bf16 n16", 32, 512, 60, 16, BF, anchor_us=231)
    for tune in BENCH_TUNES[1:]:
        bench(rows, "b8 d2048 L2048 bf16 n16", 8, 2048, 2048, 16, BF, anchor_us=2410, tune=tune)
        bench(rows, "b8 d2048 L8192 bf16 n16", 8, 2048, 8192, 16, BF, anchor_us=9500, tune=tune)
        bench(rows, "game b32 d512 L60 bf16 n16", 32, 512, 60, 16, BF, anchor_us=231, tune=tune)
    bench(rows, "b8 d2048 L2048 fp32 n16", 8, 2048, 2048, 16, DT_FP32)
    bench(rows, "b1 d64 L100000 bf16 n16", 1, 64, 100000, 16, BF)
    print("\n".join(["", "== bench =="] + rows), flush=True)


# ----------------------------------------------------------------------------------------------- compile
def variants():
    out = []
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for code, bc in ((DT_BF16, DT_BF16), (DT_FP32, DT_FP32), (DT_FP16, DT_FP32)):
            for bv, cv in ((True, True), (False, False)):
                out.append(plan_bwd(2, 64, 1000, n, 1, code, bc, bv, cv, True)["defines"])
    return out


def _case_variants(
    batch,
    dim,
    seqlen,
    dstate,
    code,
    bc_code,
    b_form,
    c_form,
    ngroups=1,
    use_saved=True,
    tune=None,
    fwd_nchunks=None,
    **_,
):
    bv, cv = b_form != "fixed", c_form != "fixed"
    g = ngroups if "var4" in (b_form, c_form) else 1
    out = [
        (
            "selective_scan_bwd.cu",
            plan_bwd(batch, dim, seqlen, dstate, g, code, bc_code, bv, cv, use_saved, tune=tune)[
                "defines"
            ],
        )
    ]
    fd = ds.plan_scan(batch, dim, seqlen, dstate, g, code, bc_code, bv, cv, nchunks=fwd_nchunks)[
        "defines"
    ]
    if use_saved and saved_state_count(seqlen) > 0:
        out.append(("selective_scan.cu", dict(fd, FS_SAVE_STATES=1, FS_SAVE_LEN=SAVE_LEN)))
    return out


def needed_variants():
    """Every (source, defines) the test matrix, the sanitizer cases and the benchmark compile."""
    cases = [(a, k) for _, a, k in test_matrix()]
    F, H, BF = DT_FP32, DT_FP16, DT_BF16
    cases += [
        ((1, 40, 300, 16, BF, F, "var4", "var4"), {}),
        ((1, 20, 600, 16, F, F, "var4", "fixed"), dict(use_saved=False)),
        ((1, 37, 33, 16, BF, BF, "fixed", "fixed"), {}),
        ((1, 9, 40, 256, F, F, "var4", "var4"), {}),
        ((1, 20, 40, 1, H, F, "var4", "fixed"), {}),
        ((1, 20, 70, 64, BF, BF, "var4", "var4"), dict(ngroups=2)),
    ]
    for tune in BENCH_TUNES:
        for b, d, L, code in (
            (8, 2048, 2048, BF),
            (32, 512, 60, BF),
            (8, 2048, 2048, F),
            (1, 64, 100000, BF),
        ):
            cases.append(((b, d, L, 16, code, code, "var3", "var3"), dict(tune=tune)))
            cases.append(
                ((b, d, L, 16, code, code, "var3", "var3"), dict(tune=tune, use_saved=False))
            )
    v = {}
    for a, k in cases:
        for src, d in _case_variants(*a, **k):
            v[(src, tuple(sorted(d.items())))] = (src, d)
        bv, cv = (
            a[6] != "fixed",
            a[7] != "fixed",
        )  # the forward without saving (bench: save on vs off)
        fd = ds.plan_scan(a[0], a[1], a[2], a[3], 1, a[4], a[5], bv, cv)["defines"]
        v[("selective_scan.cu", tuple(sorted(fd.items())))] = ("selective_scan.cu", fd)
    return list(v.values())


def _compile_one(item):
    src, d = item
    _, path = ds.compile_cubin(src, d)
    return src, d, ds.resource_usage(path)


def precompile(jobs=2):
    from concurrent.futures import ProcessPoolExecutor

    items = needed_variants()
    print(f"{len(items)} variants", flush=True)
    with ProcessPoolExecutor(jobs) as ex:
        for src, d, r in ex.map(_compile_one, items):
            spill = {e: v.get("STACK") for e, v in r.items() if v.get("STACK") not in (None, "0")}
            print(
                src,
                d.get("FS_DSTATE"),
                d.get("FS_IN_DTYPE"),
                d.get("FS_TILE_T"),
                d.get("FS_THREADS"),
                {e: v.get("REG") for e, v in r.items()},
                "spills:" if spill else "",
                spill or "",
                flush=True,
            )


def compile_all():
    for d in variants():
        _, path = ds.compile_cubin("selective_scan_bwd.cu", d)
        r = ds.resource_usage(path)
        print(
            {
                k: d[k]
                for k in ("FS_IN_DTYPE", "FS_DSTATE", "FS_NSPLIT", "FS_TILE_T", "FS_B_VARYING")
            },
            {
                e: (v.get("REG"), v.get("STACK"), v.get("LOCAL"), v.get("SHARED"))
                for e, v in r.items()
            },
            flush=True,
        )


def main():
    np.seterr(all="ignore")
    args = sys.argv[1:] or ["all"]
    if args[0] == "compile":
        compile_all()
        return
    if args[0] == "precompile":
        precompile(int(os.environ.get("FS_JOBS", "2")))
        return
    torch = _torch()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}  nvrtc: {ds._find_nvrtc()[1]}", flush=True)
    fails = 0
    if args[0] in ("test", "all"):
        fails = run_tests(quick="--quick" in args).fails
    if args[0] == "sanitize":
        fails = run_sanitize_cases().fails
    if (
        args[0] == "profile"
    ):  # under ncu: the main shape, default plan (or FS_TUNE="threads=256,min_blocks=2")
        tune = dict(
            (k, int(v))
            for k, v in (kv.split("=") for kv in os.environ.get("FS_TUNE", "").split(",") if kv)
        )
        inp = ds.make_scan_inputs(
            8, 2048, 2048, 16, DT_BF16, DT_BF16, "var3", "var3", 1, on_gpu=True
        )
        dout = torch.randn(8, 2048, 2048, device="cuda").to(torch.bfloat16)
        saved = torch.empty(8, 2048, saved_state_count(2048), 16, device="cuda")
        g = [torch.empty_like(inp["u"]) for _ in range(3)]
        f32 = lambda t: torch.empty(t.shape, device="cuda")
        for _ in range(2):
            backward(
                inp["u"],
                inp["delta"],
                inp["A"],
                inp["B"],
                inp["C"],
                inp["D"],
                inp["z"],
                inp["delta_bias"],
                True,
                None,
                dout,
                saved,
                None,
                g[0],
                g[1],
                f32(inp["A"]),
                f32(inp["B"]),
                f32(inp["C"]),
                f32(inp["D"]),
                g[2],
                f32(inp["delta_bias"]),
                None,
                tune=tune or None,
            )
        torch.cuda.synchronize()
    if args[0] in ("bench", "all"):
        run_bench()
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
