"""CPU tests of the public API (NumPy inputs take the reference path; no GPU needed).

Covers: results against naive float64 implementations and the reference, dtypes (float16,
bfloat16 through ml_dtypes, torch CPU tensors where torch is installed), `out=`, every kind of
bad input (exception type and the argument named in the message), empty problems,
available()/info() without a GPU, the CLI, the fallback policy, and the CUDA dispatch path
driven by a fake CUDA framework and a fake native module.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import flashscan
from flashscan import _backend, _frameworks, attention, reference, scan
from flashscan._frameworks import NumpyHandler

# ---------------------------------------------------------------------------------------------
# Naive float64 implementations (independent of the reference's blockwise/chunked algorithms)
# ---------------------------------------------------------------------------------------------


def naive_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float | None = None,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = np.repeat(k, h // hk, axis=2)
    v = np.repeat(v, h // hk, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None] + sk - sq
    j = np.arange(sk)[None, :]
    vis = np.ones((sq, sk), dtype=bool)
    if right >= 0:
        vis &= j <= i + right
    if left >= 0:
        vis &= j >= i - left
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk else np.full((b, h, sq, 1), -np.inf)
    seen = np.isfinite(m)
    p = np.exp(s - np.where(seen, m, 0.0))
    den = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", p / np.where(seen, den, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(seen, den, 1.0)), -np.inf)[..., 0]
    return o, lse


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def naive_scan(
    u: np.ndarray,
    delta: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    D: np.ndarray | None = None,
    z: np.ndarray | None = None,
    delta_bias: np.ndarray | None = None,
    delta_softplus: bool = False,
    initial_state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    f = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    u, delta, A, B, C, D, z, delta_bias = map(f, (u, delta, A, B, C, D, z, delta_bias))
    batch, dim, L = u.shape
    n = A.shape[1]

    def per_step(m: np.ndarray) -> Callable[[int], np.ndarray]:
        if m.ndim == 2:  # (dim, n) fixed
            return lambda t: m[None]
        if m.ndim == 3:
            m = m[:, None]
        g = m.shape[1]
        m = np.repeat(m, dim // g, axis=1)  # (batch, dim, n, L)
        return lambda t: m[..., t]

    b_at, c_at = per_step(B), per_step(C)
    dt = delta + (delta_bias[None, :, None] if delta_bias is not None else 0.0)
    if delta_softplus:
        dt = _softplus(dt)
    x = np.zeros((batch, dim, n)) if initial_state is None else f(initial_state).copy()
    y = np.empty((batch, dim, L))
    for t in range(L):
        dtt = dt[..., t][..., None]
        x = np.exp(dtt * A[None]) * x + dtt * b_at(t) * u[..., t][..., None]
        y[..., t] = (x * c_at(t)).sum(-1)
    if D is not None:
        y += D[None, :, None] * u
    if z is not None:
        y *= _silu(z)
    return y, x


def naive_state_update(
    state: np.ndarray,
    x: np.ndarray,
    dt: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    D: np.ndarray | None = None,
    z: np.ndarray | None = None,
    dt_bias: np.ndarray | None = None,
    dt_softplus: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    f = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    state, x, dt, A, B, C, D, z, dt_bias = map(f, (state, x, dt, A, B, C, D, z, dt_bias))
    heads = state.ndim == 4
    if not heads:
        state, x, dt = state[:, None], x[:, None], dt[:, None]
        A, B, C = A[None], B[:, None], C[:, None]
        D = None if D is None else D[None]
        z = None if z is None else z[:, None]
        dt_bias = None if dt_bias is None else dt_bias[None]
    h = state.shape[1]
    B = np.repeat(B, h // B.shape[1], axis=1)[:, :, None]
    C = np.repeat(C, h // C.shape[1], axis=1)[:, :, None]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = _softplus(dt)
    new = state * np.exp(dt[..., None] * A) + dt[..., None] * B * x[..., None]
    y = (new * C).sum(-1)
    if D is not None:
        y = y + D * x
    if z is not None:
        y = y * _silu(z)
    if not heads:
        new, y = new[:, 0], y[:, 0]
    return new, y


# ---------------------------------------------------------------------------------------------
# Input makers
# ---------------------------------------------------------------------------------------------


def qkv(
    rng: np.random.Generator,
    b: int,
    sq: int,
    sk: int,
    h: int,
    hk: int,
    d: int,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = rng.standard_normal((b, sq, h, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    return q, k, v


def scan_inputs(
    rng: np.random.Generator,
    batch: int = 2,
    dim: int = 8,
    L: int = 13,
    n: int = 4,
    bc: str = "varying",
    groups: int = 1,
    dtype: Any = np.float32,
) -> dict[str, Any]:
    def bc_arr() -> np.ndarray:
        if bc == "fixed":
            return rng.standard_normal((dim, n)).astype(np.float32)
        if bc == "varying":
            return rng.standard_normal((batch, n, L)).astype(dtype)
        return rng.standard_normal((batch, groups, n, L)).astype(dtype)

    return {
        "u": rng.standard_normal((batch, dim, L)).astype(dtype),
        "delta": rng.uniform(0.01, 0.8, (batch, dim, L)).astype(dtype),
        "A": -np.exp(rng.uniform(-1, 1, (dim, n))).astype(np.float32),
        "B": bc_arr(),
        "C": bc_arr(),
        "D": rng.standard_normal(dim).astype(np.float32),
        "z": rng.standard_normal((batch, dim, L)).astype(dtype),
        "delta_bias": rng.uniform(0.0, 0.1, dim).astype(np.float32),
    }


def ssu_inputs(
    rng: np.random.Generator,
    batch: int = 3,
    nheads: int | None = None,
    dim: int = 8,
    n: int = 4,
    groups: int = 1,
    dtype: Any = np.float32,
) -> dict[str, Any]:
    lead = (batch,) if nheads is None else (batch, nheads)
    hdim = () if nheads is None else (nheads,)
    bc = (batch, n) if nheads is None else (batch, groups, n)
    return {
        "state": rng.standard_normal((*lead, dim, n)).astype(np.float32),
        "x": rng.standard_normal((*lead, dim)).astype(dtype),
        "dt": rng.uniform(0.01, 0.8, (*lead, dim)).astype(dtype),
        "A": -np.exp(rng.uniform(-1, 1, (*hdim, dim, n))).astype(np.float32),
        "B": rng.standard_normal(bc).astype(dtype),
        "C": rng.standard_normal(bc).astype(dtype),
        "D": rng.standard_normal((*hdim, dim)).astype(np.float32),
        "z": rng.standard_normal((*lead, dim)).astype(dtype),
        "dt_bias": rng.uniform(0.0, 0.1, (*hdim, dim)).astype(np.float32),
    }


# ---------------------------------------------------------------------------------------------
# Attention on the reference path
# ---------------------------------------------------------------------------------------------

ATTN_CASES = [
    # b, sq, sk, h, hk, d, causal, window, softcap
    (2, 7, 7, 4, 4, 16, False, (-1, -1), 0.0),
    (1, 5, 9, 4, 2, 8, True, (-1, -1), 0.0),
    (2, 9, 5, 4, 1, 32, True, (-1, -1), 0.0),  # causal with sq > sk: rows that see no key
    (1, 1, 13, 2, 2, 16, False, (3, 0), 0.0),
    (1, 13, 1, 2, 1, 8, False, (-1, -1), 0.0),
    (2, 17, 23, 6, 3, 24, False, (4, 2), 0.0),
    (1, 11, 11, 2, 1, 16, True, (2, -1), 0.0),
    (1, 19, 140, 4, 4, 64, False, (-1, -1), 5.0),
    (2, 33, 20, 2, 2, 40, True, (-1, -1), 2.5),
    (1, 1, 1, 1, 1, 8, False, (-1, -1), 0.0),
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attention_matches_naive_float64(case: tuple, rng: np.random.Generator, rule: Any) -> None:
    b, sq, sk, h, hk, d, causal, window, softcap = case
    q, k, v = qkv(rng, b, sq, sk, h, hk, d)
    out, lse = flashscan.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True
    )
    assert out.shape == q.shape and out.dtype == np.float32
    assert lse.shape == (b, h, sq) and lse.dtype == np.float32
    ref_o, ref_l = naive_attention(q, k, v, None, causal, window, softcap)
    rule.rel(out, ref_o, 1e-5, atol=1e-6)
    rule.rel(lse, ref_l, 1e-5, atol=1e-5, name="lse")
    # the API is the reference on CPU
    direct = reference.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=False
    )
    np.testing.assert_array_equal(out, direct)


def test_attention_options(rng: np.random.Generator, rule: Any) -> None:
    q, k, v = qkv(rng, 2, 9, 12, 4, 2, 16)
    out = flashscan.flash_attn_func(q, k, v, softmax_scale=0.3)
    rule.rel(out, naive_attention(q, k, v, 0.3)[0], 1e-5)
    # causal combined with a left window; window given as a list; numpy scalar options
    out = flashscan.flash_attn_func(q, k, v, causal=np.bool_(True), window_size=[3, 7])
    rule.rel(out, naive_attention(q, k, v, None, True, (3, 0))[0], 1e-5)
    out = flashscan.flash_attn_func(q, k, v, softcap=np.float32(3.0), softmax_scale=np.float64(0.2))
    rule.rel(out, naive_attention(q, k, v, 0.2, softcap=3.0)[0], 1e-5)


def test_attention_float16(rng: np.random.Generator, rule: Any) -> None:
    q, k, v = qkv(rng, 2, 21, 30, 4, 2, 32, np.float16)
    out, lse = flashscan.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    ref_o, _ = naive_attention(q, k, v, causal=True)
    # baseline: the float64 result rounded to float16
    rule.check(out, ref_o, ref_o.astype(np.float16), atol=1e-3)


def test_attention_bfloat16_numpy(rng: np.random.Generator, rule: Any) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    q, k, v = (a.astype(bf16) for a in qkv(rng, 1, 10, 14, 2, 2, 16))
    out, lse = flashscan.flash_attn_func(q, k, v, return_lse=True)
    assert out.dtype == bf16 and out.shape == q.shape and lse.dtype == np.float32
    ref_o, ref_l = naive_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    rule.check(out.astype(np.float64), ref_o, ref_o.astype(bf16).astype(np.float64), atol=1e-3)
    rule.rel(lse, ref_l, 1e-5, atol=1e-5, name="lse")


def test_attention_out_is_written_in_place(rng: np.random.Generator) -> None:
    q, k, v = qkv(rng, 2, 8, 8, 2, 2, 16)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    res = flashscan.flash_attn_func(q, k, v, out=out)
    assert res is out
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, naive_attention(q, k, v)[0], rtol=1e-5, atol=1e-6)
    res2, lse = flashscan.flash_attn_func(q, k, v, out=out, return_lse=True)
    assert res2 is out and lse.shape == (2, 2, 8)


def test_attention_does_not_modify_inputs(rng: np.random.Generator) -> None:
    q, k, v = qkv(rng, 1, 6, 6, 2, 1, 8)
    before = [a.copy() for a in (q, k, v)]
    flashscan.flash_attn_func(q, k, v, causal=True, softcap=2.0)
    for a, b0 in zip((q, k, v), before):
        np.testing.assert_array_equal(a, b0)


# ---------------------------------------------------------------------------------------------
# Selective scan and state update on the reference path
# ---------------------------------------------------------------------------------------------

SCAN_CASES = [
    # bc form, groups, D/z/bias, softplus, initial state
    ("fixed", 1, True, True, False),
    ("varying", 1, False, False, False),
    ("varying", 1, True, True, True),
    ("grouped", 2, True, False, True),
    ("grouped", 4, False, True, False),
]


@pytest.mark.parametrize("case", SCAN_CASES, ids=lambda c: "-".join(map(str, c)))
def test_scan_matches_naive_float64(case: tuple, rng: np.random.Generator) -> None:
    bc, groups, extras, softplus, init = case
    a = scan_inputs(rng, bc=bc, groups=groups)
    if not extras:
        a["D"] = a["z"] = a["delta_bias"] = None
    x0 = rng.standard_normal((2, 8, 4)).astype(np.float32) if init else None
    out, last = flashscan.selective_scan_fn(
        **a, delta_softplus=softplus, return_last_state=True, initial_state=x0
    )
    assert out.shape == a["u"].shape and out.dtype == np.float32
    assert last.shape == (2, 8, 4) and last.dtype == np.float32
    ref_y, ref_x = naive_scan(**a, delta_softplus=softplus, initial_state=x0)
    np.testing.assert_allclose(out, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(last, ref_x, rtol=1e-5, atol=1e-5)
    only = flashscan.selective_scan_fn(**a, delta_softplus=softplus, initial_state=x0)
    assert isinstance(only, np.ndarray)
    np.testing.assert_array_equal(only, out)


def test_scan_chunked_stream_equals_whole(rng: np.random.Generator) -> None:
    a = scan_inputs(rng, L=50, bc="grouped", groups=2)
    whole, whole_last = flashscan.selective_scan_fn(
        **a, delta_softplus=True, return_last_state=True
    )
    state = None
    pieces = []
    for t0, t1 in ((0, 1), (1, 17), (17, 18), (18, 50)):
        part = {
            k: (v[..., t0:t1].copy() if k in ("u", "delta", "z", "B", "C") else v)
            for k, v in a.items()
        }
        y, state = flashscan.selective_scan_fn(
            **part, delta_softplus=True, return_last_state=True, initial_state=state
        )
        pieces.append(y)
    np.testing.assert_allclose(np.concatenate(pieces, axis=-1), whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, whole_last, rtol=1e-5, atol=1e-5)


def test_scan_float16_and_float32_bc(rng: np.random.Generator, rule: Any) -> None:
    a = scan_inputs(rng, dtype=np.float16)
    a["C"] = a["C"].astype(np.float32)  # B in u's dtype, C float32: allowed
    out = flashscan.selective_scan_fn(**a, delta_softplus=True)
    assert out.dtype == np.float16
    ref, _ = naive_scan(**a, delta_softplus=True)
    rule.check(out, ref, ref.astype(np.float16), atol=1e-3)


def test_scan_bfloat16_numpy(rng: np.random.Generator) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = scan_inputs(rng)
    for key in ("u", "delta", "z", "B", "C"):
        a[key] = a[key].astype(ml_dtypes.bfloat16)
    out, last = flashscan.selective_scan_fn(**a, return_last_state=True)
    assert out.dtype == ml_dtypes.bfloat16 and last.dtype == np.float32
    ref, _ = naive_scan(**{k: (None if v is None else v.astype(np.float64)) for k, v in a.items()})
    assert np.abs(out.astype(np.float64) - ref).max() <= 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize("form", ["flat", "heads", "heads-grouped"])
def test_state_update_in_place(form: str, rng: np.random.Generator) -> None:
    if form == "flat":
        a = ssu_inputs(rng)
    else:
        a = ssu_inputs(rng, nheads=4, groups=2 if form == "heads-grouped" else 1)
    others = {k: v.copy() for k, v in a.items() if k != "state"}
    state = a["state"]
    before = state.copy()
    new_ref, y_ref = naive_state_update(before, **others, dt_softplus=True)
    out = flashscan.selective_state_update(**a, dt_softplus=True)
    assert out.shape == a["x"].shape and out.dtype == a["x"].dtype
    assert a["state"] is state
    np.testing.assert_allclose(state, new_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, y_ref, rtol=1e-5, atol=1e-5)
    for k, v in others.items():
        np.testing.assert_array_equal(a[k], v, err_msg=f"{k} was modified")


def test_state_update_optional_args(rng: np.random.Generator) -> None:
    a = ssu_inputs(rng, dtype=np.float16)
    a["D"] = a["z"] = a["dt_bias"] = None
    before = a["state"].copy()
    new_ref, y_ref = naive_state_update(before, **{k: v for k, v in a.items() if k != "state"})
    out = flashscan.selective_state_update(**a)
    assert out.dtype == np.float16
    np.testing.assert_allclose(a["state"], new_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.astype(np.float64), y_ref, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------------------------------
# Empty problems: a valid empty result, no error
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b,sq,sk,h,hk", [(0, 5, 5, 2, 2), (2, 0, 5, 2, 2), (2, 5, 0, 2, 2), (2, 5, 5, 0, 1)]
)
def test_attention_empty(
    b: int, sq: int, sk: int, h: int, hk: int, rng: np.random.Generator
) -> None:
    q, k, v = qkv(rng, b, sq, sk, h, hk, 16)
    out, lse = flashscan.flash_attn_func(q, k, v, return_lse=True, causal=True)
    assert out.shape == (b, sq, h, 16) and out.dtype == np.float32
    assert lse.shape == (b, h, sq) and lse.dtype == np.float32
    if sk == 0:  # queries that see no key: 0 and -inf
        assert (out == 0).all() and np.isneginf(lse).all()


def test_scan_empty(rng: np.random.Generator) -> None:
    a = scan_inputs(rng, batch=0)
    out, last = flashscan.selective_scan_fn(**a, return_last_state=True)
    assert out.shape == (0, 8, 13) and last.shape == (0, 8, 4)
    a = scan_inputs(rng, L=0)
    x0 = rng.standard_normal((2, 8, 4)).astype(np.float32)
    out, last = flashscan.selective_scan_fn(**a, return_last_state=True, initial_state=x0)
    assert out.shape == (2, 8, 0) and out.dtype == np.float32
    np.testing.assert_array_equal(last, x0)
    _, last = flashscan.selective_scan_fn(**a, return_last_state=True)
    assert (last == 0).all()


def test_state_update_empty(rng: np.random.Generator) -> None:
    a = ssu_inputs(rng, batch=0)
    out = flashscan.selective_state_update(**a)
    assert out.shape == (0, 8)


# ---------------------------------------------------------------------------------------------
# Bad input: the right exception, naming the argument
# ---------------------------------------------------------------------------------------------

_R = np.random.default_rng(1)
Q, K, V = qkv(_R, 2, 6, 6, 4, 2, 16)


def _attn(**over: Any) -> Callable[[], Any]:
    args: dict[str, Any] = {"q": Q, "k": K, "v": V}
    args.update(over)
    return lambda: flashscan.flash_attn_func(**args)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


_S = scan_inputs(np.random.default_rng(2))
_SG = scan_inputs(np.random.default_rng(3), bc="grouped", groups=2)


def _scan(base: dict[str, Any] | None = None, **over: Any) -> Callable[[], Any]:
    args = dict(base or _S)
    args.update(over)
    return lambda: flashscan.selective_scan_fn(**args)


_U = ssu_inputs(np.random.default_rng(4))
_UH = ssu_inputs(np.random.default_rng(5), nheads=4, groups=2)


def _ssu(base: dict[str, Any] | None = None, **over: Any) -> Callable[[], Any]:
    args = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in (base or _U).items()}
    args.update(over)
    return lambda: flashscan.selective_state_update(**args)


BAD = [
    # name, call, exception, words the message must contain
    ("q-list", _attn(q=[[1.0]]), TypeError, ["q", "list"]),
    ("q-none", _attn(q=None), TypeError, ["q"]),
    ("k-str", _attn(k="k"), TypeError, ["k", "str"]),
    ("q-int", _attn(q=Q.astype(np.int32)), TypeError, ["q", "int32"]),
    ("q-float64", _attn(q=Q.astype(np.float64)), TypeError, ["q", "float64"]),
    ("k-mixed", _attn(k=K.astype(np.float16)), TypeError, ["k", "float16", "float32"]),
    ("v-mixed", _attn(v=V.astype(np.float16)), TypeError, ["v", "float16"]),
    ("q-3d", _attn(q=Q[0]), ValueError, ["q", "4-D", "3-D"]),
    ("k-5d", _attn(k=K[None]), ValueError, ["k", "4-D"]),
    ("k-batch", _attn(k=K[:1], v=V[:1]), ValueError, ["k", "batch"]),
    ("k-headdim", _attn(k=K[..., :8].copy(), v=V[..., :8].copy()), ValueError, ["k", "headdim"]),
    ("v-shape", _attn(v=V[:, :3]), ValueError, ["v", "shape"]),
    (
        "gqa",
        _attn(k=np.repeat(K, 3, 2)[:, :, :3], v=np.repeat(V, 3, 2)[:, :, :3]),
        ValueError,
        ["nheads", "3"],
    ),
    (
        "headdim-12",
        _attn(q=Q[..., :12].copy(), k=K[..., :12].copy(), v=V[..., :12].copy()),
        ValueError,
        ["headdim", "12", "multiples of 8"],
    ),
    ("q-noncontig", _attn(q=np.repeat(Q, 2, axis=3)[..., ::2]), ValueError, ["q", "contiguous"]),
    ("v-noncontig", _attn(v=np.repeat(V, 2, axis=3)[..., ::2]), ValueError, ["v", "contiguous"]),
    ("window-bad", _attn(window_size=(-2, 0)), ValueError, ["window_size", "-2"]),
    ("window-type", _attn(window_size="ab"), TypeError, ["window_size"]),
    ("window-float", _attn(window_size=(1.5, 0)), TypeError, ["window_size"]),
    ("window-len", _attn(window_size=(1, 2, 3)), TypeError, ["window_size"]),
    ("softcap-neg", _attn(softcap=-1.0), ValueError, ["softcap"]),
    ("softcap-nan", _attn(softcap=float("nan")), ValueError, ["softcap"]),
    ("scale-str", _attn(softmax_scale="x"), TypeError, ["softmax_scale"]),
    ("scale-inf", _attn(softmax_scale=float("inf")), ValueError, ["softmax_scale"]),
    ("causal-str", _attn(causal="yes"), TypeError, ["causal"]),
    ("lse-str", _attn(return_lse="no"), TypeError, ["return_lse"]),
    ("out-readonly", _attn(out=_readonly(np.empty_like(Q))), ValueError, ["out", "read-only"]),
    ("out-shape", _attn(out=np.empty((2, 6, 4, 8), np.float32)), ValueError, ["out", "shape"]),
    ("out-dtype", _attn(out=np.empty_like(Q, dtype=np.float16)), TypeError, ["out", "dtype"]),
    ("out-list", _attn(out=[1]), TypeError, ["out"]),
    # selective_scan_fn
    ("u-list", _scan(u=[1.0]), TypeError, ["u", "list"]),
    ("u-2d", _scan(u=_S["u"][0]), ValueError, ["u", "3-D"]),
    ("u-int", _scan(u=_S["u"].astype(np.int64)), TypeError, ["u", "int64"]),
    ("delta-mixed", _scan(delta=_S["delta"].astype(np.float16)), TypeError, ["delta", "float16"]),
    ("delta-shape", _scan(delta=_S["delta"][:, :, :5]), ValueError, ["delta", "shape"]),
    ("A-dtype", _scan(A=_S["A"].astype(np.float16)), TypeError, ["A", "float32"]),
    ("A-dim", _scan(A=_S["A"][:4]), ValueError, ["A", "dim"]),
    ("A-1d", _scan(A=_S["A"][0]), ValueError, ["A", "2-D"]),
    (
        "dstate-300",
        _scan(
            A=np.zeros((8, 300), np.float32),
            B=np.zeros((8, 300), np.float32),
            C=np.zeros((8, 300), np.float32),
        ),
        flashscan.UnsupportedError,
        ["dstate", "300"],
    ),
    ("B-5d", _scan(B=_S["B"][None, None]), ValueError, ["B"]),
    ("B-shape", _scan(B=_S["B"][:, :3]), ValueError, ["B", "shape"]),
    ("B-fixed-shape", _scan(B=np.zeros((8, 5), np.float32)), ValueError, ["B", "(8, 4)"]),
    (
        "B-groups",
        _scan(_SG, B=np.zeros((2, 3, 4, 13), np.float32)),
        ValueError,
        ["B", "ngroups", "3"],
    ),
    ("C-groups", _scan(_SG, C=np.zeros((2, 4, 4, 13), np.float32)), ValueError, ["C", "ngroups"]),
    ("B-float64", _scan(B=_S["B"].astype(np.float64)), TypeError, ["B", "float64"]),
    ("B-f16-with-f32", _scan(B=_S["B"].astype(np.float16)), TypeError, ["B", "float16"]),
    ("D-shape", _scan(D=_S["D"][:4]), ValueError, ["D", "shape"]),
    ("D-dtype", _scan(D=_S["D"].astype(np.float16)), TypeError, ["D", "float32"]),
    ("z-shape", _scan(z=_S["z"][:1]), ValueError, ["z", "shape"]),
    ("z-dtype", _scan(z=_S["z"].astype(np.float16)), TypeError, ["z", "float16"]),
    ("bias-shape", _scan(delta_bias=np.zeros(3, np.float32)), ValueError, ["delta_bias"]),
    (
        "init-shape",
        _scan(initial_state=np.zeros((2, 8, 5), np.float32)),
        ValueError,
        ["initial_state", "shape"],
    ),
    (
        "init-dtype",
        _scan(initial_state=np.zeros((2, 8, 4), np.float16)),
        TypeError,
        ["initial_state", "float32"],
    ),
    ("u-noncontig", _scan(u=np.repeat(_S["u"], 2, 2)[..., ::2]), ValueError, ["u", "contiguous"]),
    ("softplus-str", _scan(delta_softplus="x"), TypeError, ["delta_softplus"]),
    # selective_state_update
    ("state-list", _ssu(state=[0.0]), TypeError, ["state", "list"]),
    ("state-f16", _ssu(state=_U["state"].astype(np.float16)), TypeError, ["state", "float32"]),
    ("state-2d", _ssu(state=_U["state"][0]), ValueError, ["state", "3-D"]),
    ("x-shape", _ssu(x=_U["x"][:, :4]), ValueError, ["x", "shape"]),
    ("dt-dtype", _ssu(dt=_U["dt"].astype(np.float16)), TypeError, ["dt", "float16"]),
    ("A-shape", _ssu(A=_U["A"][:4]), ValueError, ["A", "shape"]),
    (
        "B-ssu-groups",
        _ssu(_UH, B=np.zeros((3, 3, 4), np.float32)),
        ValueError,
        ["B", "ngroups", "nheads"],
    ),
    ("C-ssu-groups", _ssu(_UH, C=np.zeros((3, 1, 4), np.float32)), ValueError, ["C", "ngroups"]),
    ("D-ssu-shape", _ssu(_UH, D=np.zeros(8, np.float32)), ValueError, ["D", "(nheads, dim)"]),
    ("bias-ssu", _ssu(dt_bias=np.zeros(3, np.float32)), ValueError, ["dt_bias"]),
    ("state-readonly", _ssu(state=_readonly(_U["state"])), ValueError, ["state", "read-only"]),
    (
        "dstate-257",
        _ssu(state=np.zeros((3, 8, 257), np.float32)),
        flashscan.UnsupportedError,
        ["dstate", "257"],
    ),
    ("ssu-x-int", _ssu(x=_U["x"].astype(np.int32)), TypeError, ["x", "int32"]),
]


@pytest.mark.parametrize("name,call,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name: str, call: Callable[[], Any], exc: type, words: list[str]) -> None:
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{name}: {w!r} not in message {msg!r}"
    # the message starts by naming the argument
    assert msg.split(":", 1)[0].strip() in {
        "q",
        "k",
        "v",
        "out",
        "window_size",
        "softcap",
        "softmax_scale",
        "causal",
        "return_lse",
        "u",
        "delta",
        "A",
        "B",
        "C",
        "D",
        "z",
        "delta_bias",
        "initial_state",
        "delta_softplus",
        "state",
        "x",
        "dt",
        "dt_bias",
    }, msg


def test_headdim_over_256_is_unsupported() -> None:
    q = np.zeros((1, 2, 1, 264), np.float32)
    with pytest.raises(flashscan.UnsupportedError, match="headdim 264"):
        flashscan.flash_attn_func(q, q, q)
    assert issubclass(flashscan.UnsupportedError, flashscan.FlashscanError)


def test_failed_call_leaves_inputs_untouched() -> None:
    a = ssu_inputs(np.random.default_rng(6))
    state = a["state"].copy()
    with pytest.raises(ValueError):
        flashscan.selective_state_update(**{**a, "D": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(a["state"], state)


# ---------------------------------------------------------------------------------------------
# available() / info() / exceptions / CLI
# ---------------------------------------------------------------------------------------------


def test_available_and_info_never_raise() -> None:
    ok = flashscan.available()
    assert isinstance(ok, bool)
    inf = flashscan.info()
    for key in (
        "backend",
        "available",
        "reason",
        "version",
        "devices",
        "driver_version",
        "nvrtc_version",
        "nvrtc_path",
        "cache_dir",
        "fallback_policy",
    ):
        assert key in inf, key
    assert inf["available"] is ok
    assert inf["backend"] == ("cuda" if ok else "numpy")
    assert isinstance(inf["cache_dir"], str) and inf["cache_dir"]
    if not ok:
        assert isinstance(inf["reason"], str) and inf["reason"]
    else:
        assert inf["reason"] is None and inf["devices"]
    assert isinstance(flashscan.__version__, str) and flashscan.__version__


def test_exception_hierarchy() -> None:
    for cls in (flashscan.UnsupportedError, flashscan.CompileError, flashscan.CudaError):
        assert issubclass(cls, flashscan.FlashscanError)
    assert issubclass(flashscan.FlashscanError, Exception)
    assert flashscan.reference is reference
    assert callable(flashscan.reference.flash_attn_func)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(flashscan.__file__)))
    e = dict(os.environ)
    e["PYTHONPATH"] = pkg_root + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flashscan", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=600,
    )


def test_cli_info() -> None:
    r = _cli("info")
    assert r.returncode == 0, r.stderr
    assert "backend" in r.stdout and "cache dir" in r.stdout
    r = _cli("info", "--json")
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout)["backend"] in ("cuda", "numpy")


def test_cli_demo() -> None:
    r = _cli("demo", "--reps", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "backend" in r.stdout and "demo passed" in r.stdout
    assert "flash_attn_func" in r.stdout and "selective_scan_fn" in r.stdout


def test_cli_demo_numpy() -> None:
    r = _cli("demo", "--framework", "numpy", "--reps", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "numpy" in r.stdout


def test_cli_precompile_without_gpu() -> None:
    if flashscan.available():
        pytest.skip("a GPU is usable here")
    r = _cli("precompile")
    assert r.returncode == 1
    assert "no usable CUDA GPU" in r.stderr


def _nvrtc_version() -> Any:
    from flashscan import _backend

    native = _backend.native
    return None if native is None else native.backend_status()["nvrtc_version"]


def test_cli_precompile_arch_fills_the_cache_without_a_gpu(tmp_path: Any) -> None:
    """precompile --arch: NVRTC alone writes the family's main variants into the disk cache
    under the names a GPU process of that arch looks up (`<family>-<arch>-<key>.cubin`), and a
    second run finds them intact and compiles nothing."""
    if _nvrtc_version() is None:
        pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc)")
    from flashscan import _native

    fam = "ssd"  # (four main variants: two entries of two translation units)
    units = {
        v["name"].split("[", 1)[1]
        for v in _native.kernel_variants("sm_90a")
        if v["main"] and v["family"] == fam
    }
    want = len(units)  # (one compile, one cache entry a translation unit)
    assert want >= 1
    env = {"FLASHSCAN_CACHE_DIR": str(tmp_path)}
    r = _cli("precompile", "--arch", "90", "--family", fam, env=env)  # (sm_90 -> sm_90a)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"sm_90a: {want} kernel variant(s) compiled" in r.stdout, r.stdout
    files = sorted(tmp_path.glob(f"{fam}-sm_90a-*.cubin"))
    assert len(files) == want, [p.name for p in tmp_path.iterdir()]
    assert all(p.read_bytes()[:8] == b"FSCUBIN1" for p in files)
    again = _cli("precompile", "--arch", "sm_90a", "--family", fam, env=env)
    assert again.returncode == 0 and "sm_90a: 0 kernel variant(s) compiled" in again.stdout
    # a cache that cannot be written is an error here (the job), not silently skipped
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = _cli(
        "precompile", "--arch", "sm_90a", "--family", fam, env={"FLASHSCAN_CACHE_DIR": str(blocker)}
    )
    assert r.returncode == 1 and "cannot write the kernel cache" in r.stderr, r.stdout + r.stderr


def test_cli_precompile_arch_rejects_what_it_cannot_build(tmp_path: Any) -> None:
    """An unknown family names the known ones; --family without --arch; a malformed arch."""
    env = {"FLASHSCAN_CACHE_DIR": str(tmp_path)}
    if _nvrtc_version() is not None:
        r = _cli("precompile", "--arch", "sm_90a", "--family", "nope", env=env)
        assert r.returncode == 1 and "the families are" in r.stderr, r.stderr
    r = _cli("precompile", "--family", "ssd", env=env)
    assert r.returncode == 2 and "--family goes with --arch" in r.stderr
    r = _cli("precompile", "--arch", "hopper", env=env)
    assert r.returncode == 2 and "expected a name like" in r.stderr
    assert not any(tmp_path.iterdir())


def test_cli_no_command() -> None:
    r = _cli()
    assert r.returncode == 2 and "info" in r.stdout


# ---------------------------------------------------------------------------------------------
# The fallback policy
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_backend() -> Any:
    """Reset the cached policy / warning flag around a test."""
    saved = (_backend._policy, _backend._warned)
    _backend._policy, _backend._warned = None, False
    yield _backend
    _backend._policy, _backend._warned = saved


def test_policy_error_raises(fresh_backend: Any) -> None:
    with pytest.raises(flashscan.FlashscanError, match="no driver"):
        _backend.on_fallback("flash_attn_func", "no driver", policy="error")


def test_policy_warn_once(fresh_backend: Any) -> None:
    with pytest.warns(flashscan.FallbackWarning, match="flash_attn_func.*no driver"):
        _backend.on_fallback("flash_attn_func", "no driver", policy="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _backend.on_fallback("flash_attn_func", "no driver", policy="warn")  # silent now
        _backend.on_fallback("selective_scan_fn", "no driver", policy="warn")


def test_policy_silent(fresh_backend: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _backend.on_fallback("flash_attn_func", "no driver", policy="silent")
    assert _backend._warned is False


def test_policy_from_environment(fresh_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHSCAN_FALLBACK", "ERROR")
    assert _backend.fallback_policy() == "error"
    monkeypatch.setenv("FLASHSCAN_FALLBACK", "silent")
    assert _backend.fallback_policy() == "error"  # read once per process
    _backend._policy = None
    assert _backend.fallback_policy() == "silent"
    _backend._policy = None
    monkeypatch.delenv("FLASHSCAN_FALLBACK")
    assert _backend.fallback_policy() == "warn"
    _backend._policy = None
    monkeypatch.setenv("FLASHSCAN_FALLBACK", "sometimes")
    with pytest.raises(ValueError, match="FLASHSCAN_FALLBACK"):
        _backend.fallback_policy()
    with pytest.raises(ValueError):
        _backend.on_fallback("x", "y", policy="never")


# ---------------------------------------------------------------------------------------------
# The CUDA dispatch, driven by a fake CUDA framework (NumPy arrays that claim to live on
# cuda:<n>) and a fake native module computing with the reference
# ---------------------------------------------------------------------------------------------


class FakeCuda:
    """A NumPy array pretending to be on cuda:<dev>."""

    def __init__(self, a: np.ndarray, dev: int = 0) -> None:
        self.a, self.dev = a, dev

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.dev)

    def __dlpack__(self, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise BufferError("fake")


class FakeCudaHandler(NumpyHandler):
    name = "fakecuda"

    def describe(self, x: FakeCuda, arg: str) -> Any:
        d = super().describe(x.a, arg)
        return (id(x), d[1], d[2], d[3], 2, x.dev)

    def stream(self, device_id: int) -> int:
        return 1000 + device_id

    def empty(self, shape: tuple, dtype: str, like: Any, desc: Any) -> FakeCuda:
        return FakeCuda(np.full(shape, np.nan, dtype=np.dtype(dtype)), like.dev)

    def writable(self, x: FakeCuda) -> bool:
        return bool(x.a.flags.writeable)

    def to_host(self, x: FakeCuda) -> np.ndarray:
        return x.a.copy()

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Any) -> FakeCuda:
        return FakeCuda(a.astype(np.dtype(dtype)), like.dev)

    def copy_into(self, dst: FakeCuda, a: np.ndarray) -> None:
        dst.a[...] = a


class FakeNative:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def flash_attn_fwd(self, q, k, v, out, lse, scale, wl, wr, softcap, stream) -> None:  # noqa: ANN001
        self.calls.append(("flash_attn_fwd", (scale, wl, wr, softcap, stream, lse is None)))
        o, lse_ = reference.flash_attn_func(
            q.a,
            k.a,
            v.a,
            softmax_scale=scale,
            window_size=(wl, wr),
            softcap=softcap,
            return_lse=True,
        )
        out.a[...] = o
        if lse is not None:
            lse.a[...] = lse_

    def selective_scan_fwd(
        self, u, delta, A, B, C, D, z, bias, init, out, last, softplus, stream
    ) -> None:  # noqa: ANN001, E501
        self.calls.append(("selective_scan_fwd", (softplus, stream, last is None)))
        un = lambda x: None if x is None else x.a  # noqa: E731
        y, x = reference.selective_scan_fn(
            u.a,
            delta.a,
            A.a,
            B.a,
            C.a,
            un(D),
            un(z),
            un(bias),
            delta_softplus=softplus,
            return_last_state=True,
            initial_state=un(init),
        )
        out.a[...] = y
        if last is not None:
            last.a[...] = x

    def selective_state_update(
        self, state, x, dt, A, B, C, D, z, bias, out, softplus, stream
    ) -> None:  # noqa: ANN001, E501
        self.calls.append(("selective_state_update", (softplus, stream)))
        un = lambda a: None if a is None else a.a  # noqa: E731
        out.a[...] = reference.selective_state_update(
            state.a, x.a, dt.a, A.a, B.a, C.a, un(D), un(z), un(bias), dt_softplus=softplus
        )


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(_frameworks._HANDLERS, FakeCuda, FakeCudaHandler())
    monkeypatch.setattr(_backend, "_policy", None)
    monkeypatch.setattr(_backend, "_warned", False)
    return FakeCuda


@pytest.fixture
def fake_native(fake_cuda: Any, monkeypatch: pytest.MonkeyPatch) -> FakeNative:
    nat = FakeNative()
    monkeypatch.setattr(attention, "_native", nat)
    monkeypatch.setattr(scan, "_native", nat)
    monkeypatch.setattr(_backend, "_usable", frozenset({0}))
    return nat


def _cuda(d: dict[str, Any], dev: int = 0) -> dict[str, Any]:
    return {k: (None if v is None else FakeCuda(v, dev)) for k, v in d.items()}


def test_dispatch_attention(fake_native: FakeNative, rng: np.random.Generator) -> None:
    q, k, v = qkv(rng, 2, 9, 7, 4, 2, 16)
    out = flashscan.flash_attn_func(FakeCuda(q), FakeCuda(k), FakeCuda(v), causal=True)
    assert isinstance(out, FakeCuda) and out.dev == 0
    np.testing.assert_allclose(
        out.a, naive_attention(q, k, v, causal=True)[0], rtol=1e-5, atol=1e-6
    )
    name, (scale, wl, wr, cap, stream, no_lse) = fake_native.calls[-1]
    assert name == "flash_attn_fwd"
    assert (wl, wr, cap, stream, no_lse) == (-1, 0, 0.0, 1000, True)
    assert scale == pytest.approx(0.25)
    # window + softcap + lse + out=
    o = FakeCuda(np.full(q.shape, np.nan, np.float32))
    res, lse = flashscan.flash_attn_func(
        FakeCuda(q),
        FakeCuda(k),
        FakeCuda(v),
        softmax_scale=0.5,
        window_size=(3, 1),
        softcap=4.0,
        return_lse=True,
        out=o,
    )
    assert res is o and isinstance(lse, FakeCuda) and lse.a.shape == (2, 4, 9)
    assert fake_native.calls[-1][1] == (0.5, 3, 1, 4.0, 1000, False)
    ref_o, ref_l = naive_attention(q, k, v, 0.5, False, (3, 1), 4.0)
    np.testing.assert_allclose(o.a, ref_o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse.a, ref_l, rtol=1e-5, atol=1e-5)


def test_dispatch_attention_devices(fake_native: FakeNative, rng: np.random.Generator) -> None:
    q, k, v = qkv(rng, 1, 4, 4, 2, 2, 8)
    with pytest.raises(ValueError, match="k: is on cpu but q is on cuda:0.*mixing CPU and GPU"):
        flashscan.flash_attn_func(FakeCuda(q), k, FakeCuda(v))
    with pytest.raises(ValueError, match="v: is on cuda:1 but q is on cuda:0.*same device"):
        flashscan.flash_attn_func(FakeCuda(q), FakeCuda(k), FakeCuda(v, 1))
    with pytest.raises(ValueError, match="out: is on cpu"):
        flashscan.flash_attn_func(FakeCuda(q), FakeCuda(k), FakeCuda(v), out=np.empty_like(q))
    assert not fake_native.calls


def test_dispatch_attention_empty_makes_no_call(
    fake_native: FakeNative, rng: np.random.Generator
) -> None:  # noqa: E501
    q, k, v = qkv(rng, 0, 4, 4, 2, 2, 8)
    out = flashscan.flash_attn_func(FakeCuda(q), FakeCuda(k), FakeCuda(v))
    assert isinstance(out, FakeCuda) and out.a.shape == q.shape
    assert not fake_native.calls


def test_dispatch_scan(fake_native: FakeNative, rng: np.random.Generator) -> None:
    a = scan_inputs(rng, bc="grouped", groups=2)
    x0 = rng.standard_normal((2, 8, 4)).astype(np.float32)
    out, last = flashscan.selective_scan_fn(
        **_cuda(a), delta_softplus=True, return_last_state=True, initial_state=FakeCuda(x0)
    )
    assert isinstance(out, FakeCuda) and isinstance(last, FakeCuda)
    assert fake_native.calls[-1] == ("selective_scan_fwd", (True, 1000, False))
    ref_y, ref_x = naive_scan(**a, delta_softplus=True, initial_state=x0)
    np.testing.assert_allclose(out.a, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(last.a, ref_x, rtol=1e-5, atol=1e-5)


def test_dispatch_state_update(fake_native: FakeNative, rng: np.random.Generator) -> None:
    a = ssu_inputs(rng, nheads=4, groups=2)
    args = _cuda(a)
    state = args["state"]
    before = a["state"].copy()
    out = flashscan.selective_state_update(**args, dt_softplus=True)
    assert fake_native.calls[-1] == ("selective_state_update", (True, 1000))
    new_ref, y_ref = naive_state_update(
        before, **{k: v for k, v in a.items() if k != "state"}, dt_softplus=True
    )
    np.testing.assert_allclose(state.a, new_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.a, y_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["warn", "silent", "error"])
def test_fallback_through_the_api(
    policy: str, fake_cuda: Any, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """GPU arrays with no usable backend: host reference and back, per the policy."""
    monkeypatch.setattr(_backend, "_usable", frozenset())
    monkeypatch.setenv("FLASHSCAN_FALLBACK", policy)
    q, k, v = qkv(rng, 1, 5, 5, 2, 2, 8)
    a = ssu_inputs(rng)
    before = a["state"].copy()
    if policy == "error":
        with pytest.raises(flashscan.FlashscanError, match="FLASHSCAN_FALLBACK=error"):
            flashscan.flash_attn_func(FakeCuda(q), FakeCuda(k), FakeCuda(v))
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = flashscan.flash_attn_func(FakeCuda(q), FakeCuda(k), FakeCuda(v), causal=True)
        s = scan_inputs(rng)
        y = flashscan.selective_scan_fn(**_cuda(s))
        args = _cuda(a)
        o = flashscan.selective_state_update(**args)
    fw = [w for w in caught if issubclass(w.category, flashscan.FallbackWarning)]
    assert len(fw) == (1 if policy == "warn" else 0)
    if fw:
        assert fw[0].filename == __file__  # points at the caller
    assert isinstance(out, FakeCuda) and isinstance(y, FakeCuda) and isinstance(o, FakeCuda)
    np.testing.assert_allclose(
        out.a, naive_attention(q, k, v, causal=True)[0], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(y.a, naive_scan(**s)[0], rtol=1e-5, atol=1e-5)
    new_ref, y_ref = naive_state_update(before, **{k: v for k, v in a.items() if k != "state"})
    np.testing.assert_allclose(args["state"].a, new_ref, rtol=1e-5, atol=1e-5)  # written back
    np.testing.assert_allclose(o.a, y_ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# torch CPU tensors (where torch is installed): the reference path, results in torch
# ---------------------------------------------------------------------------------------------


def test_torch_cpu_round_trip(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    q, k, v = qkv(rng, 2, 7, 9, 4, 2, 16)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        tq, tk, tv = (torch.from_numpy(a).to(dt) for a in (q, k, v))
        out, lse = flashscan.flash_attn_func(tq, tk, tv, causal=True, return_lse=True)
        assert isinstance(out, torch.Tensor) and out.dtype == dt and out.device.type == "cpu"
        assert lse.dtype == torch.float32 and lse.shape == (2, 4, 7)
        ref = naive_attention(*(t.double().numpy() for t in (tq, tk, tv)), causal=True)[0]
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dt]
        assert np.abs(out.double().numpy() - ref).max() <= tol * np.abs(ref).max()
    o = torch.full((2, 7, 4, 16), float("nan"))
    res = flashscan.flash_attn_func(*(torch.from_numpy(a) for a in (q, k, v)), out=o)
    assert res is o and not torch.isnan(o).any()


def test_torch_cpu_scan_and_state_update(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    a = scan_inputs(rng)
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    t["u"], t["delta"], t["z"] = (t[k].to(torch.bfloat16) for k in ("u", "delta", "z"))
    t["B"], t["C"] = t["B"].to(torch.bfloat16), t["C"].to(torch.bfloat16)
    out, last = flashscan.selective_scan_fn(**t, return_last_state=True)
    assert out.dtype == torch.bfloat16 and last.dtype == torch.float32
    s = ssu_inputs(rng)
    ts = {k: torch.from_numpy(v.copy()) for k, v in s.items()}
    state = ts["state"]
    ptr = state.data_ptr()
    new_ref, y_ref = naive_state_update(s["state"], **{k: v for k, v in s.items() if k != "state"})
    o = flashscan.selective_state_update(**ts)
    assert state.data_ptr() == ptr
    np.testing.assert_allclose(state.numpy(), new_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o.numpy(), y_ref, rtol=1e-5, atol=1e-5)


def test_torch_descriptor_tuple() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros((2, 3, 4), dtype=torch.bfloat16)[:, 1:]
    h = _frameworks.handler_of(t, "t")
    assert h.name == "torch" and h.fast
    assert h.describe(t, "t") == (t.data_ptr(), (2, 2, 4), (12, 4, 1), "bfloat16", 1, 0)
    assert _frameworks.handler_of(torch.nn.Parameter(torch.zeros(2)), "p") is h


@pytest.mark.parametrize("missing", ["delta", "A", "B", "C"])
def test_scan_none_for_a_required_array_names_it(missing: str) -> None:
    rng = np.random.default_rng()
    args = {
        "u": rng.standard_normal((1, 4, 5)).astype(np.float32),
        "delta": rng.random((1, 4, 5)).astype(np.float32),
        "A": -rng.random((4, 3)).astype(np.float32),
        "B": rng.standard_normal((4, 3)).astype(np.float32),
        "C": rng.standard_normal((4, 3)).astype(np.float32),
    }
    args[missing] = None
    with pytest.raises(TypeError, match=f"^{missing}: expected an array"):
        flashscan.selective_scan_fn(**args)


@pytest.mark.parametrize("missing", ["state", "dt", "A", "B", "C"])
def test_state_update_none_for_a_required_array_names_it(missing: str) -> None:
    rng = np.random.default_rng()
    args = {
        "state": rng.standard_normal((2, 4, 3)).astype(np.float32),
        "x": rng.standard_normal((2, 4)).astype(np.float32),
        "dt": rng.random((2, 4)).astype(np.float32),
        "A": -rng.random((4, 3)).astype(np.float32),
        "B": rng.standard_normal((2, 3)).astype(np.float32),
        "C": rng.standard_normal((2, 3)).astype(np.float32),
    }
    args[missing] = None
    with pytest.raises(TypeError, match=f"^{missing}: expected an array"):
        flashscan.selective_state_update(**args)
