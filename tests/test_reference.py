"""CPU tests of the NumPy references against naive float64 implementations written here."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest

try:
    from flashscan import reference as ref
except ImportError:  # the package's __init__ may need the native module; load the file alone
    _path = Path(__file__).resolve().parents[1] / "python" / "flashscan" / "reference.py"
    _spec = importlib.util.spec_from_file_location("flashscan_reference", _path)
    ref = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(ref)

_seeds = itertools.count(1000)


def rng() -> np.random.Generator:
    """A fresh generator per call: every test draws different inputs."""
    return np.random.default_rng(next(_seeds))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| over finite entries (inf entries must match exactly)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite])
    assert np.isfinite(got[finite]).all()
    if not finite.any():
        return 0.0
    scale = max(np.abs(want[finite]).max(), 1e-30)
    return float(np.abs(got[finite] - want[finite]).max() / scale)


TOL = {np.float32: 1e-5, np.float64: 1e-12}


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


def naive_attention(q, k, v, scale, causal, window, softcap):
    """Full score matrix in float64 with explicit masks; returns (out, lse)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    sq, nheads, sk, nheads_k = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    group = nheads // nheads_k
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    visible = np.ones((sq, sk), dtype=bool)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    s = np.where(visible, s, -np.inf)
    any_visible = visible.any(axis=1)[:, None]
    m = np.where(any_visible, s.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", p / np.where(denom > 0, denom, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = np.where(denom > 0, np.log(denom) + m, -np.inf)[..., 0]
    return out, lse


def attn_inputs(batch, sq, sk, nheads, nheads_k, hd, dtype, q_scale=1.0):
    g = rng()
    q = (g.standard_normal((batch, sq, nheads, hd)) * q_scale).astype(dtype)
    k = g.standard_normal((batch, sk, nheads_k, hd)).astype(dtype)
    v = g.standard_normal((batch, sk, nheads_k, hd)).astype(dtype)
    return q, k, v


@pytest.fixture(params=["default", "tiny"])
def blocks(request, monkeypatch):
    """Run with the default tiles, and with tiny ones (many query blocks, skipping, masks)."""
    if request.param == "tiny":
        monkeypatch.setattr(ref, "_BLOCK_K", 16)
        monkeypatch.setattr(ref, "_BLOCK_Q_MAX", 8)
    return request.param


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window, softcap)
ATTN_CASES = [
    (2, 37, 300, 4, 4, 40, False, (-1, -1), 0.0),  # no mask, blockwise (300 > 128)
    (1, 200, 200, 2, 2, 64, True, (-1, -1), 0.0),  # causal, square
    (2, 50, 300, 4, 4, 24, True, (-1, -1), 0.0),  # causal, seqlen_q < seqlen_k
    (2, 300, 50, 4, 4, 24, True, (-1, -1), 0.0),  # causal, seqlen_q > seqlen_k: empty rows
    (1, 150, 260, 2, 2, 16, False, (32, -1), 0.0),  # left window only
    (1, 150, 260, 2, 2, 16, False, (-1, 17), 0.0),  # right window only
    (1, 260, 150, 2, 2, 16, False, (20, 5), 0.0),  # both, seqlen_q > seqlen_k: empty rows
    (1, 200, 300, 2, 2, 16, True, (64, -1), 0.0),  # causal + left window
    (1, 300, 200, 2, 2, 16, True, (40, 7), 0.0),  # causal overrides right, with left
    (2, 65, 257, 8, 2, 32, False, (-1, -1), 0.0),  # GQA
    (2, 65, 257, 8, 2, 32, True, (-1, -1), 0.0),  # GQA causal
    (1, 70, 190, 6, 1, 8, True, (25, -1), 0.0),  # MQA, window
    (2, 40, 200, 4, 2, 40, False, (-1, -1), 2.0),  # softcap (scores reach well past it)
    (1, 129, 129, 2, 1, 72, True, (-1, -1), 5.0),  # softcap, causal, MQA
    (1, 1, 1, 2, 2, 8, False, (-1, -1), 0.0),  # seqlen 1
    (1, 1, 1, 2, 2, 8, True, (-1, -1), 0.0),
    (2, 1, 300, 3, 3, 7, True, (-1, -1), 0.0),  # one query, causal: sees everything
    (2, 1, 300, 3, 3, 7, False, (10, 0), 0.0),  # one query, window
    (2, 300, 1, 3, 3, 7, True, (-1, -1), 0.0),  # one key: only the last query sees it
    (2, 300, 1, 3, 3, 7, False, (-1, -1), 0.0),
    (1, 33, 140, 2, 2, 1, False, (-1, -1), 0.0),  # head dim 1
    (1, 33, 140, 2, 2, 13, True, (3, 3), 0.0),  # odd head dim
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_matches_naive(case, dtype, blocks):
    batch, sq, sk, h, hk, hd, causal, window, softcap = case
    q, k, v = attn_inputs(batch, sq, sk, h, hk, hd, dtype, q_scale=3.0 if softcap else 1.0)
    scale = 1.0 / np.sqrt(hd) if dtype == np.float32 else 0.37
    copies = [a.copy() for a in (q, k, v)]
    out, lse = ref.flash_attn_func(
        q, k, v, scale, causal, window, softcap, return_lse=True, accum_dtype=dtype
    )
    want_out, want_lse = naive_attention(q, k, v, scale, causal, window, softcap)
    assert out.dtype == dtype and out.shape == (batch, sq, h, hd)
    assert lse.dtype == np.float32 and lse.shape == (batch, h, sq)
    assert rel_err(out, want_out) < TOL[dtype]
    # lse is float32 whatever the accumulation: compare at float32 precision.
    assert rel_err(lse, want_lse) < 1e-6
    empty = np.isneginf(want_lse)  # rows that see no key: zero output, lse -inf
    assert (out.transpose(0, 2, 1, 3)[empty] == 0).all()
    if causal and sq > sk:
        assert empty.any()
    for a, c in zip((q, k, v), copies):
        assert np.array_equal(a, c)


def test_attention_float64_lse_is_float32_of_exact():
    q, k, v = attn_inputs(1, 20, 150, 2, 2, 16, np.float64)
    _, lse = ref.flash_attn_func(q, k, v, return_lse=True, accum_dtype=np.float64)
    _, want = naive_attention(q, k, v, 0.25, False, (-1, -1), 0.0)
    assert np.array_equal(lse, want.astype(np.float32))


def test_attention_default_scale_and_no_lse():
    q, k, v = attn_inputs(2, 30, 140, 4, 2, 24, np.float32)
    out = ref.flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, np.ndarray)
    want, _ = naive_attention(q, k, v, 1 / np.sqrt(24), True, (-1, -1), 0.0)
    assert rel_err(out, want) < 1e-5


def test_attention_float16_inputs():
    q, k, v = attn_inputs(2, 50, 200, 4, 1, 64, np.float16)
    out, lse = ref.flash_attn_func(q, k, v, causal=True, return_lse=True)
    want, want_lse = naive_attention(q, k, v, 1 / 8, True, (-1, -1), 0.0)
    assert out.dtype == np.float16
    assert rel_err(out, want) < 1e-3  # one float16 rounding of the result
    assert rel_err(lse, want_lse) < 1e-6


def test_attention_out_argument():
    q, k, v = attn_inputs(2, 45, 170, 4, 2, 32, np.float32)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    got = ref.flash_attn_func(q, k, v, causal=True, window_size=(50, -1), out=out)
    assert got is out
    want, _ = naive_attention(q, k, v, 1 / np.sqrt(32), True, (50, -1), 0.0)
    assert rel_err(out, want) < 1e-5
    got, lse = ref.flash_attn_func(q, k, v, out=out, return_lse=True)
    assert got is out and lse.shape == (2, 4, 45)


@pytest.mark.parametrize("shape", [(0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_attention_empty(shape):
    batch, sq, sk = shape
    q, k, v = attn_inputs(batch, sq, sk, 2, 1, 8, np.float32)
    out, lse = ref.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.shape == (batch, sq, 2, 8) and lse.shape == (batch, 2, sq)
    assert (out == 0).all() and np.isneginf(lse).all()


# --------------------------------------------------------------------------------------------
# Selective scan
# --------------------------------------------------------------------------------------------


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def per_channel(m, t, dim):
    """B or C at step t as (batch or 1, dim, dstate)."""
    if m.ndim == 2:
        return m[None]
    if m.ndim == 3:
        return m[:, None, :, t]
    return np.repeat(m[:, :, :, t], dim // m.shape[1], axis=1)


def naive_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, softplus_=False, x0=None):
    """Per-timestep float64 loop; returns (out, last_state)."""
    u, delta, A, B, C, D, z, delta_bias, x0 = (
        None if a is None else np.asarray(a, dtype=np.float64)
        for a in (u, delta, A, B, C, D, z, delta_bias, x0)
    )
    batch, dim, seqlen = u.shape
    dt = delta if delta_bias is None else delta + delta_bias[:, None]
    if softplus_:
        dt = softplus(dt)
    x = np.zeros((batch, dim, A.shape[1])) if x0 is None else x0
    out = np.empty((batch, dim, seqlen))
    for t in range(seqlen):
        dt_t = dt[:, :, t, None]
        x = np.exp(dt_t * A) * x + dt_t * per_channel(B, t, dim) * u[:, :, t, None]
        y = (x * per_channel(C, t, dim)).sum(axis=-1)
        if D is not None:
            y = y + D * u[:, :, t]
        if z is not None:
            y = y * silu(z[:, :, t])
        out[:, :, t] = y
    return out, x


def bc_matrix(g, kind, batch, dim, dstate, seqlen, dtype):
    if kind == "fixed":
        return g.standard_normal((dim, dstate)).astype(dtype)
    if kind == "varying":
        return g.standard_normal((batch, dstate, seqlen)).astype(dtype)
    groups = int(kind[len("groups") :])
    return g.standard_normal((batch, groups, dstate, seqlen)).astype(dtype)


def scan_inputs(batch, dim, dstate, seqlen, b_kind, c_kind, dtype, softplus_):
    g = rng()
    u = g.standard_normal((batch, dim, seqlen)).astype(dtype)
    if softplus_:
        delta = (g.standard_normal((batch, dim, seqlen)) - 1.0).astype(dtype)
    else:
        delta = g.uniform(0.51, 1.0, (batch, dim, seqlen)).astype(dtype)  # > 0 with the bias
    A = (-np.exp(g.standard_normal((dim, dstate)) * 0.7)).astype(np.float32)
    B = bc_matrix(g, b_kind, batch, dim, dstate, seqlen, dtype)
    C = bc_matrix(g, c_kind, batch, dim, dstate, seqlen, dtype)
    if dtype == np.float64:
        A = A.astype(np.float64)
    extras = {
        "D": g.standard_normal(dim).astype(np.float32),
        "z": g.standard_normal((batch, dim, seqlen)).astype(dtype),
        "delta_bias": g.uniform(-0.5, 0.5, dim).astype(np.float32),
        "initial_state": g.standard_normal((batch, dim, dstate)).astype(np.float32),
    }
    return (u, delta, A, B, C), extras


# (batch, dim, dstate, seqlen, B kind, C kind)
SCAN_SHAPES = [
    (2, 6, 16, 1, "fixed", "fixed"),
    (2, 6, 16, 7, "varying", "varying"),
    (1, 8, 1, 33, "groups2", "groups2"),
    (3, 4, 16, 1000, "varying", "varying"),  # several chunks at the default budget
    (2, 12, 4, 65, "groups3", "groups3"),
    (2, 8, 16, 40, "fixed", "varying"),
    (2, 8, 16, 40, "groups4", "fixed"),
    (1, 12, 3, 21, "groups2", "groups3"),  # different group counts for B and C
]

# (D, z, delta_bias, softplus, initial_state)
SCAN_OPTIONS = [
    (False, False, False, False, False),
    (True, True, True, True, True),
    (True, False, False, True, False),
    (False, True, True, False, True),
]


@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("options", SCAN_OPTIONS, ids=lambda o: "".join("01"[x] for x in o))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scan_matches_naive(shape, options, dtype):
    batch, dim, dstate, seqlen, b_kind, c_kind = shape
    use_d, use_z, use_bias, sp, use_x0 = options
    args, extras = scan_inputs(batch, dim, dstate, seqlen, b_kind, c_kind, dtype, sp)
    kw = {
        "D": extras["D"] if use_d else None,
        "z": extras["z"] if use_z else None,
        "delta_bias": extras["delta_bias"] if use_bias else None,
    }
    x0 = extras["initial_state"] if use_x0 else None
    copies = [a.copy() for a in (*args, *extras.values())]
    out, last = ref.selective_scan_fn(
        *args, **kw, delta_softplus=sp, return_last_state=True, initial_state=x0
    )
    want, want_last = naive_scan(*args, **kw, softplus_=sp, x0=x0)
    assert out.dtype == dtype and out.shape == (batch, dim, seqlen)
    assert last.dtype == dtype and last.shape == (batch, dim, dstate)
    assert rel_err(out, want) < TOL[dtype]
    assert rel_err(last, want_last) < TOL[dtype]
    for a, c in zip((*args, *extras.values()), copies):
        assert np.array_equal(a, c)


@pytest.mark.parametrize("budget", [1, 50, 1 << 16])
def test_scan_chunk_sizes(budget, monkeypatch):
    """One step per chunk, short chunks with a ragged tail, and long chunks agree."""
    monkeypatch.setattr(ref, "_SCAN_BUDGET", budget)
    args, extras = scan_inputs(2, 3, 4, 103, "groups3", "varying", np.float32, True)
    x0 = extras["initial_state"]
    out, last = ref.selective_scan_fn(
        *args, D=extras["D"], z=extras["z"], delta_softplus=True, return_last_state=True,
        initial_state=x0,
    )  # fmt: skip
    want, want_last = naive_scan(*args, D=extras["D"], z=extras["z"], softplus_=True, x0=x0)
    assert rel_err(out, want) < 1e-5
    assert rel_err(last, want_last) < 1e-5


def test_scan_without_last_state_returns_array():
    args, _ = scan_inputs(1, 4, 16, 9, "varying", "varying", np.float32, False)
    out = ref.selective_scan_fn(*args)
    assert isinstance(out, np.ndarray)
    assert rel_err(out, naive_scan(*args)[0]) < 1e-5


def test_scan_float16_inputs():
    args, extras = scan_inputs(2, 8, 16, 50, "varying", "varying", np.float16, True)
    out = ref.selective_scan_fn(*args, D=extras["D"], z=extras["z"], delta_softplus=True)
    want, _ = naive_scan(*args, D=extras["D"], z=extras["z"], softplus_=True)
    assert out.dtype == np.float16
    assert rel_err(out, want) < 1e-3


@pytest.mark.parametrize("b_kind", ["fixed", "groups2"])
def test_scan_streaming_in_chunks_equals_whole(b_kind):
    batch, dim, dstate, seqlen = 2, 8, 16, 301
    args, extras = scan_inputs(batch, dim, dstate, seqlen, b_kind, b_kind, np.float32, True)
    u, delta, A, B, C = args
    kw = {"D": extras["D"], "delta_bias": extras["delta_bias"], "delta_softplus": True}
    whole, whole_last = ref.selective_scan_fn(
        u, delta, A, B, C, z=extras["z"], **kw, return_last_state=True
    )
    state, pieces = None, []
    for t0, t1 in [(0, 100), (100, 201), (201, 301)]:
        piece = slice(t0, t1)
        Bp = B if B.ndim == 2 else B[..., piece]
        Cp = C if C.ndim == 2 else C[..., piece]
        out, state = ref.selective_scan_fn(
            u[..., piece], delta[..., piece], A, Bp, Cp, z=extras["z"][..., piece], **kw,
            return_last_state=True, initial_state=state,
        )  # fmt: skip
        assert state.dtype == np.float32
        pieces.append(out)
    assert rel_err(np.concatenate(pieces, axis=-1), whole) < 1e-5
    assert rel_err(state, whole_last) < 1e-5


def test_scan_long_sequence_is_fast():
    """seqlen 100000 at small batch * dim stays well within a few seconds."""
    import time

    args, extras = scan_inputs(1, 4, 16, 100_000, "varying", "varying", np.float32, True)
    t = time.perf_counter()
    out, last = ref.selective_scan_fn(
        *args, D=extras["D"], delta_softplus=True, return_last_state=True
    )
    assert time.perf_counter() - t < 5.0
    assert np.isfinite(out).all() and np.isfinite(last).all()


@pytest.mark.parametrize("shape", [(0, 4, 16, 9), (2, 4, 16, 0)])
def test_scan_empty(shape):
    batch, dim, dstate, seqlen = shape
    args, extras = scan_inputs(batch, dim, dstate, seqlen, "varying", "varying", np.float32, False)
    x0 = extras["initial_state"]
    out, last = ref.selective_scan_fn(*args, return_last_state=True, initial_state=x0)
    assert out.shape == (batch, dim, seqlen)
    assert np.array_equal(last, x0)


# --------------------------------------------------------------------------------------------
# State update
# --------------------------------------------------------------------------------------------


def naive_update(state, x, dt, A, B, C, D, z, dt_bias, softplus_):
    """Float64 loop over heads; layout (batch, nheads, dim, ...). Returns (out, new_state)."""
    f = [None if a is None else np.asarray(a, dtype=np.float64) for a in (state, x, dt, A, B, C)]
    state, x, dt, A, B, C = f
    batch, nheads, dim, _ = state.shape
    groups = B.shape[1]
    new = np.empty_like(state)
    out = np.empty((batch, nheads, dim))
    for h in range(nheads):
        g = h // (nheads // groups)
        dt_h = dt[:, h] + (0.0 if dt_bias is None else dt_bias[h])
        if softplus_:
            dt_h = softplus(dt_h)
        dt_h = dt_h[..., None]
        new[:, h] = state[:, h] * np.exp(dt_h * A[h]) + dt_h * B[:, g, None] * x[:, h, :, None]
        y = (new[:, h] * C[:, g, None]).sum(axis=-1)
        if D is not None:
            y = y + D[h] * x[:, h]
        if z is not None:
            y = y * silu(np.asarray(z[:, h], dtype=np.float64))
        out[:, h] = y
    return out, new


def update_inputs(batch, nheads, dim, dstate, groups, dtype):
    """Inputs in the heads layout."""
    g = rng()
    return {
        "state": g.standard_normal((batch, nheads, dim, dstate)).astype(np.float32),
        "x": g.standard_normal((batch, nheads, dim)).astype(dtype),
        "dt": g.standard_normal((batch, nheads, dim)).astype(dtype),
        "A": (-np.exp(g.standard_normal((nheads, dim, dstate)) * 0.7)).astype(np.float32),
        "B": g.standard_normal((batch, groups, dstate)).astype(dtype),
        "C": g.standard_normal((batch, groups, dstate)).astype(dtype),
        "D": g.standard_normal((nheads, dim)).astype(np.float32),
        "z": g.standard_normal((batch, nheads, dim)).astype(dtype),
        "dt_bias": g.uniform(-0.5, 0.5, (nheads, dim)).astype(np.float32),
    }


@pytest.mark.parametrize("nheads,groups", [(1, 1), (4, 1), (4, 2), (6, 6)])
@pytest.mark.parametrize("options", [(True, True, True, True), (False, False, False, False)])
@pytest.mark.parametrize("dstate", [1, 16])
def test_state_update_heads_matches_naive(nheads, groups, options, dstate):
    use_d, use_z, use_bias, sp = options
    inp = update_inputs(3, nheads, 5, dstate, groups, np.float32)
    for name, used in (("D", use_d), ("z", use_z), ("dt_bias", use_bias)):
        if not used:
            inp[name] = None
    want, want_state = naive_update(**inp, softplus_=sp)
    state = inp["state"]
    copies = {k: a.copy() for k, a in inp.items() if a is not None and k != "state"}
    out = ref.selective_state_update(**inp, dt_softplus=sp)
    assert out.dtype == np.float32 and out.shape == (3, nheads, 5)
    assert inp["state"] is state and state.dtype == np.float32
    assert rel_err(state, want_state) < 1e-6
    assert rel_err(out, want) < 1e-5
    for k, c in copies.items():  # nothing but the state changed
        assert np.array_equal(inp[k], c)


@pytest.mark.parametrize("dstate", [1, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_state_update_is_one_scan_step(dstate, dtype):
    """Without heads: the update equals a length-1 scan from the same state."""
    batch, dim = 3, 7
    args, extras = scan_inputs(batch, dim, dstate, 1, "varying", "varying", dtype, True)
    u, delta, A, B, C = args
    x0 = extras["initial_state"].astype(dtype)
    want, want_state = ref.selective_scan_fn(
        *args, D=extras["D"], z=extras["z"], delta_bias=extras["delta_bias"],
        delta_softplus=True, return_last_state=True, initial_state=x0,
    )  # fmt: skip
    naive, naive_state = naive_scan(
        *args, D=extras["D"], z=extras["z"], delta_bias=extras["delta_bias"], softplus_=True,
        x0=x0,
    )  # fmt: skip
    state = x0.copy()
    out = ref.selective_state_update(
        state, u[..., 0], delta[..., 0], A, B[..., 0], C[..., 0], D=extras["D"],
        z=extras["z"][..., 0], dt_bias=extras["delta_bias"], dt_softplus=True,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == (batch, dim)
    assert rel_err(out, want[..., 0]) < TOL[dtype]
    assert rel_err(state, want_state) < TOL[dtype]
    assert rel_err(out, naive[..., 0]) < TOL[dtype]
    assert rel_err(state, naive_state) < TOL[dtype]


def test_state_update_heads_is_one_grouped_scan_step():
    """Heads layout == a length-1 scan over dim' = nheads * dim with the same groups."""
    batch, nheads, dim, dstate, groups = 2, 4, 3, 16, 2
    inp = update_inputs(batch, nheads, dim, dstate, groups, np.float32)
    flat = nheads * dim
    want, want_state = ref.selective_scan_fn(
        inp["x"].reshape(batch, flat, 1), inp["dt"].reshape(batch, flat, 1),
        inp["A"].reshape(flat, dstate), inp["B"][..., None], inp["C"][..., None],
        D=inp["D"].reshape(flat), z=inp["z"].reshape(batch, flat, 1),
        delta_bias=inp["dt_bias"].reshape(flat), delta_softplus=True, return_last_state=True,
        initial_state=inp["state"].reshape(batch, flat, dstate),
    )  # fmt: skip
    out = ref.selective_state_update(**inp, dt_softplus=True)
    assert rel_err(out.reshape(batch, flat), want[..., 0]) < 1e-6
    assert rel_err(inp["state"].reshape(batch, flat, dstate), want_state) < 1e-6


def test_state_update_float16_inputs():
    inp = update_inputs(2, 4, 8, 16, 2, np.float16)
    want, want_state = naive_update(**inp, softplus_=True)
    out = ref.selective_state_update(**inp, dt_softplus=True)
    assert out.dtype == np.float16
    assert inp["state"].dtype == np.float32
    assert rel_err(inp["state"], want_state) < 1e-6
    assert rel_err(out, want) < 1e-3


def test_state_update_empty_batch():
    inp = update_inputs(0, 2, 4, 16, 1, np.float32)
    out = ref.selective_state_update(**inp)
    assert out.shape == (0, 2, 4)
