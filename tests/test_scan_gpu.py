"""GPU tests of `selective_scan_fn` and `selective_state_update` (torch on CUDA; cupy and jax
where installed).

The correctness rule over a sampled matrix of issue 4: fixed / varying / grouped B and C, with
and without D, z, delta_bias, softplus, initial and last state, dstate {1, 4, 16, 64, 256},
seqlens {1, 2, 7, 60, 64, 2047, 4096, 100000}, fp32/fp16/bf16. Reference: a float64 torch scan
(chunked: exact decay products within chunks of 16 steps, a sequential carry between chunks).
Baseline for fp16/bf16 outputs: the float64 result rounded to the output dtype (the kernel
accumulates in fp32 from the same inputs); fp32 outputs: 1e-4 relative. The state (fp32) is
held to 1e-4 relative everywhere. Also: poisoned outputs, chunked streaming == whole scan,
state update in place, cupy/jax round trips, a non-default stream, CUDA graph capture.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import flashscan

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SEQLENS = [1, 2, 7, 60, 64, 2047, 4096, 100000]
DSTATES = [1, 4, 16, 64, 256]
STATE_RTOL = 1e-4
FP32_RTOL = 1e-4


# ---------------------------------------------------------------------------------------------
# float64 torch references
# ---------------------------------------------------------------------------------------------


def _expand_bc(m: Any, batch: int, dim: int, L: int) -> Any:
    """B or C as (batch, dim, L, n) float64 (a broadcast view where possible)."""
    m = m.double()
    if m.dim() == 2:  # (dim, n)
        return m[None, :, None, :].expand(batch, dim, L, m.shape[1])
    if m.dim() == 3:  # (batch, n, L)
        return m.transpose(1, 2)[:, None].expand(batch, dim, L, m.shape[1])
    g = m.shape[1]  # (batch, g, n, L)
    return m.transpose(2, 3).repeat_interleave(dim // g, dim=1)


def scan_ref(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any | None = None,
    z: Any | None = None,
    delta_bias: Any | None = None,
    delta_softplus: bool = False,
    initial_state: Any | None = None,
    chunk: int = 16,
) -> tuple[Any, Any]:
    """(y, last_state) of the selective scan in float64."""
    u, delta, A = u.double(), delta.double(), A.double()
    batch, dim, L = u.shape
    n = A.shape[1]
    dt = delta if delta_bias is None else delta + delta_bias.double()[None, :, None]
    if delta_softplus:
        dt = F.softplus(dt)  # threshold 20, as mamba
    T = chunk
    Lp = -(-L // T) * T
    nc = Lp // T
    dA = dt[..., None] * A[None, :, None, :]  # (b, dim, L, n)
    dBu = (dt * u)[..., None] * _expand_bc(B, batch, dim, L)
    if Lp != L:  # padded steps: decay 1, no input
        dA = F.pad(dA, (0, 0, 0, Lp - L))
        dBu = F.pad(dBu, (0, 0, 0, Lp - L))
    dA = dA.reshape(batch, dim, nc, T, n)
    dBu = dBu.reshape(batch, dim, nc, T, n)
    S = dA.cumsum(dim=3)
    tri = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()  # [t, s]: s <= t
    diff = S[..., :, None, :] - S[..., None, :, :]  # (b, dim, nc, T(t), T(s), n)
    W = torch.exp(diff.masked_fill(~tri[:, :, None], float("-inf")))
    local = torch.einsum("bdctsn,bdcsn->bdctn", W, dBu)
    del W, diff
    decay_end = torch.exp(S[:, :, :, -1])  # (b, dim, nc, n)
    x = (
        torch.zeros(batch, dim, n, dtype=torch.float64, device=u.device)
        if initial_state is None
        else initial_state.double().clone()
    )
    starts = []
    for c in range(nc):
        starts.append(x)
        x = decay_end[:, :, c] * x + local[:, :, c, -1]
    start = torch.stack(starts, dim=2)  # (b, dim, nc, n)
    xs = local + torch.exp(S) * start[:, :, :, None]  # (b, dim, nc, T, n)
    xs = xs.reshape(batch, dim, Lp, n)[:, :, :L]
    y = (xs * _expand_bc(C, batch, dim, L)).sum(-1)
    if D is not None:
        y = y + D.double()[None, :, None] * u
    if z is not None:
        y = y * F.silu(z.double())
    return y, x


def state_update_ref(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any | None = None,
    z: Any | None = None,
    dt_bias: Any | None = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]:
    """(new_state, out) of one decode step in float64 (inputs are not modified)."""
    heads = state.dim() == 4
    f = lambda t: None if t is None else t.double()  # noqa: E731
    state, x, dt, A, B, C, D, z, dt_bias = map(f, (state, x, dt, A, B, C, D, z, dt_bias))
    if not heads:
        state, x, dt = state[:, None], x[:, None], dt[:, None]
        A, B, C = A[None], B[:, None], C[:, None]
        D = None if D is None else D[None]
        z = None if z is None else z[:, None]
        dt_bias = None if dt_bias is None else dt_bias[None]
    h = state.shape[1]
    B = B.repeat_interleave(h // B.shape[1], dim=1)[:, :, None]
    C = C.repeat_interleave(h // C.shape[1], dim=1)[:, :, None]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    new = state * torch.exp(dt[..., None] * A) + dt[..., None] * B * x[..., None]
    y = (new * C).sum(-1)
    if D is not None:
        y = y + D * x
    if z is not None:
        y = y * F.silu(z)
    if not heads:
        new, y = new[:, 0], y[:, 0]
    return new, y


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _gen(device: str = "cuda") -> Any:
    g = torch.Generator(device=device)
    seed = random.getrandbits(62)
    print(f"torch seed {seed}")
    g.manual_seed(seed)
    return g


def scan_inputs(
    batch: int,
    dim: int,
    L: int,
    n: int,
    dtype: Any,
    bc: str = "varying",
    groups: int = 1,
    device: str = "cuda",
) -> dict[str, Any]:
    g = _gen(device)
    kw = {"generator": g, "device": device}

    def rnd(*s: int) -> Any:
        return torch.randn(*s, **kw)

    def uni(lo: float, hi: float, *s: int) -> Any:
        return torch.rand(*s, **kw) * (hi - lo) + lo

    def bc_arr() -> Any:
        if bc == "fixed":
            return rnd(dim, n)  # float32, as mamba's fixed B/C
        if bc == "varying":
            return rnd(batch, n, L).to(dtype)
        return rnd(batch, groups, n, L).to(dtype)

    return {
        "u": rnd(batch, dim, L).to(dtype),
        "delta": uni(-3.0, 0.5, batch, dim, L).to(dtype),  # softplus'd or clamped below
        "A": -torch.exp(uni(-1.0, 1.5, dim, n)),
        "B": bc_arr(),
        "C": bc_arr(),
        "D": rnd(dim),
        "z": rnd(batch, dim, L).to(dtype),
        "delta_bias": uni(-0.5, 0.5, dim),
    }


def check_out(rule: Any, got: Any, ref: Any, name: str = "out") -> None:
    if got.dtype == torch.float32:
        rule.rel(got, ref, FP32_RTOL, atol=1e-6, name=name)
    else:
        scale = float(ref.abs().max())
        rule.check(got, ref, ref.to(got.dtype), atol=1e-5 * max(scale, 1.0), name=name)


# ---------------------------------------------------------------------------------------------
# The sampled matrix
# ---------------------------------------------------------------------------------------------


def _cases() -> list[tuple]:
    r = random.Random(4321)
    cases = []
    forms = [("fixed", 1), ("varying", 1), ("grouped", 2), ("grouped", 4)]
    # every seqlen x every dtype, the rest drawn
    for L in SEQLENS:
        for dt in DTYPES:
            bc, g = r.choice(forms)
            n = r.choice([4, 16, 16, 64]) if L < 100000 else 16
            extras = r.random() < 0.6
            cases.append((L, dt, n, bc, g, extras, r.random() < 0.6, r.random() < 0.5))
    # every dstate x every dtype at an odd length
    for n in DSTATES:
        for dt in DTYPES:
            bc, g = r.choice(forms)
            cases.append((r.choice([63, 200]), dt, n, bc, g, True, True, r.random() < 0.5))
    return cases


CASES = _cases()


def _size(L: int, n: int) -> tuple[int, int]:
    """(batch, dim) keeping the float64 reference under ~2 GB."""
    budget = 1 << 23
    batch = 2 if L <= 4096 else 1
    dim = max(4, min(64, budget // max(1, batch * L * n)))
    return batch, dim - dim % 4


def _id(c: tuple) -> str:
    L, dt, n, bc, g, extras, softplus, init = c
    return (
        f"L{L}-{dt}-n{n}-{bc}{g if bc == 'grouped' else ''}{'-Dzbias' if extras else ''}"
        f"{'-softplus' if softplus else ''}{'-init' if init else ''}"
    )


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_scan_matrix(case: tuple, rule: Any, poison: Any) -> None:
    L, dt, n, bc, g, extras, softplus, init = case
    batch, dim = _size(L, n)
    a = scan_inputs(batch, dim, L, n, DTYPES[dt], bc, g)
    if not softplus:  # keep dt > 0 without softplus
        a["delta"] = a["delta"].float().abs().add_(0.01).to(DTYPES[dt])
    if not extras:
        a["D"] = a["z"] = a["delta_bias"] = None
    elif not softplus:
        a["delta_bias"] = a["delta_bias"].abs()
    x0 = torch.randn(batch, dim, n, device="cuda") if init else None
    u = a["u"]
    poison(u.numel() * u.element_size(), batch * dim * n * 4)
    out, last = flashscan.selective_scan_fn(
        **a, delta_softplus=softplus, return_last_state=True, initial_state=x0
    )
    assert out.shape == u.shape and out.dtype == u.dtype and out.device == u.device
    assert last.shape == (batch, dim, n) and last.dtype == torch.float32
    torch.cuda.synchronize()
    ref_y, ref_x = scan_ref(**a, delta_softplus=softplus, initial_state=x0)
    check_out(rule, out, ref_y)
    rule.rel(last, ref_x, STATE_RTOL, atol=1e-6, name="last_state")
    # without last state: the same output
    only = flashscan.selective_scan_fn(**a, delta_softplus=softplus, initial_state=x0)
    assert isinstance(only, torch.Tensor)
    torch.cuda.synchronize()
    check_out(rule, only, ref_y)


# The short-sequence plans (dstate 16, <= 64 steps: 16 / 8 / 4 lanes a channel by grid size,
# src/ops/scan.rs `short_seq_tiles`), each with a dim that leaves a block's last channels idle
# (batch, dim, seqlen, dtype, B/C form, groups)
SHORT_CASES = [
    (1, 523, 60, "bfloat16", "varying", 1),  # 16 lanes, one tile of 64
    (2, 1000, 64, "float16", "grouped", 2),  # 16 lanes, a full tile, 5 channels a block
    (1, 4100, 33, "bfloat16", "grouped", 4),  # 8 lanes, tile 32 (+ a 1-step tail tile)
    (3, 1000, 64, "float16", "varying", 1),  # 8 lanes, two full tiles
    (9, 1028, 60, "float32", "fixed", 1),  # 4 lanes, tile 16
    (33, 516, 1, "bfloat16", "varying", 1),
]


def _check_plan_case(case: tuple, rule: Any, poison: Any, checked: int | None = None) -> None:
    """One dstate-16 scan with an initial state (softplus, D, z, delta_bias) against the float64
    reference: every channel, or (`checked`) the last `checked` ones (all in the last B/C group)."""
    batch, dim, L, dt, bc, g = case
    a = scan_inputs(batch, dim, L, 16, DTYPES[dt], bc, g)
    x0 = torch.randn(batch, dim, 16, device="cuda")
    poison(a["u"].numel() * a["u"].element_size(), batch * dim * 16 * 4)
    out, last = flashscan.selective_scan_fn(
        **a, delta_softplus=True, return_last_state=True, initial_state=x0
    )
    torch.cuda.synchronize()
    part, sel = a, slice(None)
    if checked is not None:
        sel = slice(dim - checked, dim)
        part = {k: a[k][:, sel] for k in ("u", "delta", "z")}
        part.update({k: a[k][sel] for k in ("A", "D", "delta_bias")})
        for k in ("B", "C"):  # the last group's rows (fixed: the channels' rows)
            part[k] = a[k][sel] if bc == "fixed" else a[k][:, -1:] if bc == "grouped" else a[k]
    ref_y, ref_x = scan_ref(**part, delta_softplus=True, initial_state=x0[:, sel])
    check_out(rule, out[:, sel], ref_y)
    rule.rel(last[:, sel], ref_x, STATE_RTOL, atol=1e-6, name="last_state")


@pytest.mark.parametrize("case", SHORT_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_scan_short_sequence_plans(case: tuple, rule: Any, poison: Any) -> None:
    _check_plan_case(case, rule, poison)


# B / C as views into wider seqlen buffers (`off` elements in, `pad` extra steps a row: odd
# offsets, odd or even row strides, lone last steps) on the short plans, which stage B / C from
# global memory element by element; through flashscan.torch the second call replays the first's
# plan on B / C shifted by one element (same strides). (batch, dim, seqlen, off, pad, groups)
STRIDED_BC_CASES = [
    (32, 520, 61, 0, 1, 1),  # even row stride, odd seqlen
    (32, 520, 60, 1, 3, 1),  # even row stride, odd start
    (4, 1000, 63, 0, 3, 2),  # two groups
    (1, 512, 60, 0, 1, 1),  # odd row stride
    (2, 1024, 9, 2, 3, 1),  # one short tile
]


@pytest.mark.parametrize("case", STRIDED_BC_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_scan_short_plans_strided_bc(case: tuple, rule: Any, poison: Any) -> None:
    import flashscan.torch as fst

    batch, dim, L, off, pad, g = case
    a = scan_inputs(batch, dim, L, 16, torch.bfloat16, "grouped", g)
    for k in ("B", "C"):
        wide = torch.randn(batch, g, 16, L + off + pad, device="cuda").to(torch.bfloat16)
        wide[..., off : off + L] = a[k]
        a[k] = wide[..., off : off + L]
    ref = scan_ref(**a, delta_softplus=True)[0]
    poison(a["u"].numel() * a["u"].element_size(), 0)
    out = flashscan.selective_scan_fn(**a, delta_softplus=True)
    torch.cuda.synchronize()
    check_out(rule, out, ref)
    # flashscan.torch: the second call is a replay of the first's plan on B / C shifted by one
    # element (same strides)
    shift = 1 if off == 0 else -1
    for k in ("B", "C"):
        wide = torch.zeros(
            batch, g, 16, L + 2 * (off + pad + 1), device="cuda", dtype=torch.bfloat16
        )
        wide = wide.as_strided(a[k].shape, a[k].stride(), off + shift)
        wide.copy_(a[k])
        a[k + "2"] = wide
    for bk, ck in (("B", "C"), ("B2", "C2")):
        b = dict(a, B=a[bk], C=a[ck])
        del b["B2"], b["C2"]
        got = fst.selective_scan_fn(**b, delta_softplus=True)
        torch.cuda.synchronize()
        check_out(rule, got, ref, name=f"torch {bk}")


# Long unchunked scans at dstate 16 with many channels (the training shapes' plan: 4 lanes a
# channel, 32-step tiles, one pass): dims leave the last block partly idle and lengths end in a
# partial 32-step tile. The float64 reference runs on the last WIDE_CHECKED channels (the partial
# block and the full ones before it; all in the last B/C group), which keeps it inside the file's
# memory budget. On a 132-SM GPU (H100 / H200) the second and fourth take the 256-thread plan
# (`scan::wide_tiles_pay`: one wave of 64-channel blocks, the fourth's last block partly idle),
# the others the 128-thread one.
# (batch, dim, seqlen, dtype, B/C form, groups)
WIDE_CASES = [
    (2, 4300, 1100, "bfloat16", "varying", 1),
    (2, 4224, 1040, "float16", "grouped", 2),
    (1, 8460, 1025, "float32", "fixed", 1),
    (4, 3300, 1030, "bfloat16", "varying", 1),
]
WIDE_CHECKED = 76


@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_scan_long_many_channels(case: tuple, rule: Any, poison: Any) -> None:
    _check_plan_case(case, rule, poison, checked=WIDE_CHECKED)


def test_reference_helper_matches_numpy_reference() -> None:
    """Self-check of this file's float64 torch scan against flashscan.reference."""
    for bc, g in (("fixed", 1), ("varying", 1), ("grouped", 2)):
        a = scan_inputs(2, 8, 37, 4, torch.float32, bc, g)
        x0 = torch.randn(2, 8, 4, device="cuda")
        y, x = scan_ref(**a, delta_softplus=True, initial_state=x0)
        ry, rx = flashscan.reference.selective_scan_fn(
            *(None if t is None else t.double().cpu().numpy() for t in a.values()),
            delta_softplus=True,
            return_last_state=True,
            initial_state=x0.double().cpu().numpy(),
        )
        np.testing.assert_allclose(y.cpu().numpy(), ry, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(x.cpu().numpy(), rx, rtol=1e-9, atol=1e-9)


def test_scan_strided_inputs(rule: Any) -> None:
    """u, delta, z as slices of wider tensors (only seqlen contiguous), as in mamba's in_proj."""
    batch, dim, L, n = 2, 48, 300, 16
    a = scan_inputs(batch, dim, L, n, torch.bfloat16)
    wide = torch.randn(batch, 2 * dim, L, device="cuda", dtype=torch.bfloat16)
    xz = wide.clone()
    xz[:, :dim] = a["u"]
    xz[:, dim:] = a["z"]
    a["u"], a["z"] = xz[:, :dim], xz[:, dim:]
    assert not a["u"].is_contiguous()
    out = flashscan.selective_scan_fn(**a, delta_softplus=True)
    torch.cuda.synchronize()
    check_out(rule, out, scan_ref(**a, delta_softplus=True)[0])


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_chunked_streaming_equals_whole(dt: str, rule: Any) -> None:
    batch, dim, L, n = 2, 64, 4096, 16
    a = scan_inputs(batch, dim, L, n, DTYPES[dt], "grouped", 2)
    whole, whole_last = flashscan.selective_scan_fn(
        **a, delta_softplus=True, return_last_state=True
    )
    state = None
    pieces = []
    bounds = [0, 1, 1001, 1096, 4096]
    for t0, t1 in zip(bounds[:-1], bounds[1:]):
        part = {
            k: (v[..., t0:t1].contiguous() if k in ("u", "delta", "z", "B", "C") else v)
            for k, v in a.items()
        }
        y, state = flashscan.selective_scan_fn(
            **part, delta_softplus=True, return_last_state=True, initial_state=state
        )
        pieces.append(y)
    chunked = torch.cat(pieces, dim=-1)
    torch.cuda.synchronize()
    ref_y, ref_x = scan_ref(**a, delta_softplus=True)
    check_out(rule, chunked, ref_y, "chunked")
    check_out(rule, whole, ref_y, "whole")
    rule.rel(state, whole_last, 1e-5, atol=1e-6, name="chunked last_state vs whole")
    rule.rel(state, ref_x, STATE_RTOL, atol=1e-6, name="chunked last_state")


# ---------------------------------------------------------------------------------------------
# selective_state_update
# ---------------------------------------------------------------------------------------------


def ssu_inputs(
    batch: int,
    nheads: int | None,
    dim: int,
    n: int,
    dtype: Any,
    groups: int = 1,
    device: str = "cuda",
) -> dict[str, Any]:
    g = _gen(device)
    kw = {"generator": g, "device": device}
    lead = (batch,) if nheads is None else (batch, nheads)
    hd = () if nheads is None else (nheads,)
    bc = (batch, n) if nheads is None else (batch, groups, n)
    return {
        "state": torch.randn(*lead, dim, n, **kw),
        "x": torch.randn(*lead, dim, **kw).to(dtype),
        "dt": (torch.rand(*lead, dim, **kw) * 3.5 - 3.0).to(dtype),
        "A": -torch.exp(torch.rand(*hd, dim, n, **kw) * 2.5 - 1.0),
        "B": torch.randn(*bc, **kw).to(dtype),
        "C": torch.randn(*bc, **kw).to(dtype),
        "D": torch.randn(*hd, dim, **kw),
        "z": torch.randn(*lead, dim, **kw).to(dtype),
        "dt_bias": torch.rand(*hd, dim, **kw) - 0.5,
    }


SSU_CASES = [
    # batch, nheads, dim, dstate, groups, dtype, extras
    (32, None, 512, 16, 1, "float32", True),  # the game shape
    (32, None, 512, 16, 1, "bfloat16", True),
    (3, None, 40, 1, 1, "float16", False),
    (5, None, 24, 256, 1, "bfloat16", True),
    (4, 8, 64, 16, 1, "bfloat16", True),
    (4, 8, 64, 64, 2, "float32", False),
    (2, 16, 32, 128, 4, "float16", True),
    (1, 4, 80, 4, 4, "float32", True),
]


@pytest.mark.parametrize(
    "case", SSU_CASES, ids=[f"b{c[0]}-h{c[1]}-d{c[2]}-n{c[3]}-g{c[4]}-{c[5]}" for c in SSU_CASES]
)
def test_state_update(case: tuple, rule: Any, poison: Any) -> None:
    batch, nheads, dim, n, groups, dt, extras = case
    a = ssu_inputs(batch, nheads, dim, n, DTYPES[dt], groups)
    if not extras:
        a["D"] = a["z"] = a["dt_bias"] = None
    state = a["state"]
    ptr = state.data_ptr()
    others = {k: v.clone() for k, v in a.items() if k != "state" and v is not None}
    new_ref, y_ref = state_update_ref(**a, dt_softplus=True)
    x = a["x"]
    poison(x.numel() * x.element_size())
    out = flashscan.selective_state_update(**a, dt_softplus=True)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    torch.cuda.synchronize()
    assert a["state"] is state and state.data_ptr() == ptr
    rule.rel(state, new_ref, STATE_RTOL, atol=1e-6, name="state")
    check_out(rule, out, y_ref)
    for k, v in others.items():
        assert torch.equal(a[k], v), f"{k} was modified"


def test_state_update_mamba2_broadcast_strides(rule: Any) -> None:
    """A, D, dt_bias given per head and expanded with stride 0, as Mamba-2 does."""
    batch, nheads, dim, n = 4, 8, 64, 16
    a = ssu_inputs(batch, nheads, dim, n, torch.bfloat16, 2)
    a["A"] = -torch.rand(nheads, device="cuda")[:, None, None].expand(nheads, dim, n)
    a["D"] = torch.randn(nheads, device="cuda")[:, None].expand(nheads, dim)
    a["dt_bias"] = torch.randn(nheads, device="cuda")[:, None].expand(nheads, dim)
    new_ref, y_ref = state_update_ref(**a, dt_softplus=True)
    out = flashscan.selective_state_update(**a, dt_softplus=True)
    torch.cuda.synchronize()
    rule.rel(a["state"], new_ref, STATE_RTOL, atol=1e-6, name="state")
    check_out(rule, out, y_ref)


def test_state_update_matches_one_scan_step(rule: Any) -> None:
    """A decode step equals a length-1 scan from the same state (flat layout, fixed B/C
    per batch row as (batch, dstate) == varying B/C of length 1)."""
    batch, dim, n = 4, 64, 16
    a = scan_inputs(batch, dim, 1, n, torch.float32)
    x0 = torch.randn(batch, dim, n, device="cuda")
    y, last = flashscan.selective_scan_fn(
        **a, delta_softplus=True, return_last_state=True, initial_state=x0
    )
    state = x0.clone()
    out = flashscan.selective_state_update(
        state,
        a["u"][..., 0],
        a["delta"][..., 0],
        a["A"],
        a["B"][..., 0],
        a["C"][..., 0],
        a["D"],
        a["z"][..., 0],
        a["delta_bias"],
        dt_softplus=True,
    )
    torch.cuda.synchronize()
    rule.rel(state, last, 1e-5, atol=1e-6, name="state")
    rule.rel(out, y[..., 0], 1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Frameworks, streams, graphs
# ---------------------------------------------------------------------------------------------


def test_cupy_round_trip(rule: Any) -> None:
    cupy = pytest.importorskip("cupy")
    a = scan_inputs(2, 32, 100, 16, torch.float16)
    ca = {k: cupy.from_dlpack(v) for k, v in a.items()}
    out, last = flashscan.selective_scan_fn(**ca, delta_softplus=True, return_last_state=True)
    assert isinstance(out, cupy.ndarray) and isinstance(last, cupy.ndarray)
    assert out.dtype == cupy.float16 and last.dtype == cupy.float32
    cupy.cuda.get_current_stream().synchronize()
    ref_y, ref_x = scan_ref(**a, delta_softplus=True)
    check_out(rule, torch.from_dlpack(out), ref_y)
    rule.rel(torch.from_dlpack(last), ref_x, STATE_RTOL, atol=1e-6, name="last_state")
    s = ssu_inputs(4, None, 32, 16, torch.float32)
    cs = {k: cupy.from_dlpack(v) for k, v in s.items()}
    new_ref, y_ref = state_update_ref(**s)
    o = flashscan.selective_state_update(**cs)
    assert isinstance(o, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    rule.rel(s["state"], new_ref, STATE_RTOL, atol=1e-6, name="state (shared memory)")
    rule.rel(torch.from_dlpack(o), y_ref, FP32_RTOL, atol=1e-6)


def test_jax_round_trip(rule: Any) -> None:
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("jax has no GPU backend here")
    import jax.dlpack

    a = scan_inputs(2, 32, 100, 16, torch.bfloat16)
    torch.cuda.synchronize()
    ja = {k: jax.dlpack.from_dlpack(v.contiguous()) for k, v in a.items()}
    out, last = flashscan.selective_scan_fn(**ja, delta_softplus=True, return_last_state=True)
    assert isinstance(out, jax.Array) and isinstance(last, jax.Array)
    ref_y, ref_x = scan_ref(**a, delta_softplus=True)
    check_out(rule, torch.from_dlpack(out), ref_y)
    rule.rel(torch.from_dlpack(last), ref_x, STATE_RTOL, atol=1e-6, name="last_state")


def test_nondefault_torch_stream_ordering(rule: Any) -> None:
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep missing")
    a = scan_inputs(2, 64, 256, 16, torch.bfloat16)
    flashscan.selective_scan_fn(**a, delta_softplus=True)  # warm-up
    un = torch.full_like(a["u"], float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        un.copy_(a["u"])
        out = flashscan.selective_scan_fn(**{**a, "u": un}, delta_softplus=True)
        still_running = not side.query()
        res = out.clone()
    side.synchronize()
    assert still_running, "selective_scan_fn synchronised the host with the stream"
    check_out(rule, res, scan_ref(**a, delta_softplus=True)[0])

    s = ssu_inputs(8, None, 64, 16, torch.float32)
    new_ref, y_ref = state_update_ref(**s)
    flashscan.selective_state_update(**{**s, "state": s["state"].clone()})  # warm-up
    xn = torch.full_like(s["x"], float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        xn.copy_(s["x"])
        o = flashscan.selective_state_update(**{**s, "x": xn})
        res = o.clone()
    side.synchronize()
    rule.rel(res, y_ref, FP32_RTOL, atol=1e-6)
    rule.rel(s["state"], new_ref, STATE_RTOL, atol=1e-6, name="state")


def test_cuda_graph_capture_and_replay(rule: Any) -> None:
    batch, dim, L, n = 32, 512, 60, 16  # the game shape
    a = scan_inputs(batch, dim, L, n, torch.bfloat16)
    st = ssu_inputs(batch, None, dim, n, torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture
        flashscan.selective_scan_fn(**a, delta_softplus=True, return_last_state=True)
        flashscan.selective_state_update(**{**st, "state": st["state"].clone()}, dt_softplus=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    state0 = st["state"].clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, last = flashscan.selective_scan_fn(**a, delta_softplus=True, return_last_state=True)
        o = flashscan.selective_state_update(**st, dt_softplus=True)
    st["state"].copy_(state0)  # capture does not run the kernels
    for step in range(2):
        fresh = scan_inputs(batch, dim, L, n, torch.bfloat16)
        for k in ("u", "delta", "B", "C", "z"):
            a[k].copy_(fresh[k])
        out.fill_(float("nan"))
        o.fill_(float("nan"))
        before = st["state"].clone()
        g.replay()
        torch.cuda.synchronize()
        ref_y, ref_x = scan_ref(**a, delta_softplus=True)
        check_out(rule, out, ref_y, f"scan replay {step}")
        rule.rel(last, ref_x, STATE_RTOL, atol=1e-6, name="last_state")
        new_ref, y_ref = state_update_ref(**{**st, "state": before}, dt_softplus=True)
        rule.rel(st["state"], new_ref, STATE_RTOL, atol=1e-6, name=f"state after replay {step}")
        check_out(rule, o, y_ref, f"state update replay {step}")


def test_errors_on_gpu() -> None:
    a = scan_inputs(2, 8, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="mixing CPU and GPU"):
        flashscan.selective_scan_fn(**{**a, "A": a["A"].cpu()})
    with pytest.raises(ValueError, match="contiguous"):
        flashscan.selective_scan_fn(
            **{**a, "u": a["u"].transpose(1, 2).contiguous().transpose(1, 2)}
        )
    with pytest.raises(flashscan.UnsupportedError, match="dstate 512"):
        big = {
            **a,
            "A": torch.zeros(8, 512, device="cuda"),
            "B": torch.zeros(8, 512, device="cuda"),
            "C": torch.zeros(8, 512, device="cuda"),
        }
        flashscan.selective_scan_fn(**big)
    s = ssu_inputs(2, None, 8, 4, torch.float32)
    with pytest.raises(TypeError, match="state"):
        flashscan.selective_state_update(**{**s, "state": s["state"].half()})


def test_empty_on_gpu() -> None:
    a = scan_inputs(2, 8, 0, 4, torch.bfloat16)
    x0 = torch.randn(2, 8, 4, device="cuda")
    out, last = flashscan.selective_scan_fn(**a, return_last_state=True, initial_state=x0)
    assert out.shape == (2, 8, 0) and out.device.type == "cuda" and out.dtype == torch.bfloat16
    assert torch.equal(last, x0)
