"""CPU tests of the NumPy reference backward passes.

The gradients are checked against float64 finite differences of the forward references
(`reference.flash_attn_func`, `reference.selective_scan_fn`: directional derivatives of
sum(dout * out) + sum(dlast * last), one random direction per input), then blocked/chunked
against unblocked, float32 against float64, and, where torch is installed, against torch's
float64 autograd of a plain implementation written here.
"""

from __future__ import annotations

import itertools
import time
import tracemalloc

import numpy as np
import pytest

from flashscan import reference as ref
from flashscan import reference_bwd as bwd

_seeds = itertools.count(2000)


def rng() -> np.random.Generator:
    """A fresh generator per call: every test draws different inputs."""
    return np.random.default_rng(next(_seeds))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (0 when want is all 0 and got matches)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    assert np.isfinite(got).all() and np.isfinite(want).all()
    err = float(np.abs(got - want).max(initial=0.0))
    scale = float(np.abs(want).max(initial=0.0))
    return err / scale if scale > 0 else err


def fd_check(loss, xs, grads, names, tol):
    """For each input i: <grads[i], d> against the 4th-order central difference of loss along a
    random direction d of x_i alone. The error is measured against sum |grads[i] * d| (the size
    of the terms of the inner product), so a wrong gradient anywhere fails."""
    g = rng()
    for i, (x, grad, name) in enumerate(zip(xs, grads, names)):
        assert grad.shape == x.shape, f"{name}: shape {grad.shape} != {x.shape}"
        assert np.isfinite(grad).all(), f"{name}: non-finite gradient"
        d = g.standard_normal(x.shape)
        eps = 1e-3

        def at(h, i=i, d=d):
            ys = list(xs)
            ys[i] = xs[i] + h * d
            return loss(ys)

        num = (8 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12 * eps)
        ana = float(np.sum(grad * d))
        size = float(np.sum(np.abs(grad * d))) + abs(num)
        assert abs(ana - num) <= tol * size + 1e-12, (
            f"{name}: analytic {ana!r}, finite difference {num!r}, size {size:.3e}"
        )


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


def attn_problem(batch, sq, sk, nheads, nheads_k, hd, hd_v, softcap, dtype=np.float64):
    g = rng()
    q = g.standard_normal((batch, sq, nheads, hd)) * (3.0 if softcap else 1.0)
    k = g.standard_normal((batch, sk, nheads_k, hd))
    v = g.standard_normal((batch, sk, nheads_k, hd_v))
    dout = g.standard_normal((batch, sq, nheads, hd_v))
    return [a.astype(dtype) for a in (q, k, v)], dout.astype(dtype)


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, headdim_v, causal, window, softcap)
ATTN_CASES = [
    (2, 37, 150, 2, 2, 16, 16, False, (-1, -1), 0.0),  # no mask, two key blocks
    (1, 60, 60, 2, 2, 8, 8, True, (-1, -1), 0.0),  # causal, square
    (2, 20, 70, 2, 2, 8, 8, True, (-1, -1), 0.0),  # causal, seqlen_q < seqlen_k
    (2, 70, 20, 2, 2, 8, 8, True, (-1, -1), 0.0),  # causal, seqlen_q > seqlen_k: empty rows
    (1, 50, 90, 2, 2, 8, 8, False, (12, -1), 0.0),  # left window only
    (1, 50, 90, 2, 2, 8, 8, False, (-1, 9), 0.0),  # right window only
    (1, 90, 50, 2, 2, 8, 8, False, (10, 3), 0.0),  # both, seqlen_q > seqlen_k: empty rows
    (1, 40, 70, 2, 2, 8, 8, True, (15, -1), 0.0),  # causal + left window
    (1, 70, 40, 2, 2, 8, 8, True, (9, 7), 0.0),  # causal overrides right
    (2, 33, 140, 8, 2, 16, 16, False, (-1, -1), 0.0),  # GQA 4:1
    (2, 33, 60, 8, 2, 16, 16, True, (-1, -1), 0.0),  # GQA 4:1, causal
    (1, 30, 55, 6, 1, 8, 8, True, (11, -1), 0.0),  # MQA, window
    (2, 20, 50, 4, 2, 12, 12, False, (-1, -1), 2.0),  # softcap (scores well past it)
    (1, 45, 45, 4, 1, 9, 9, True, (-1, -1), 5.0),  # softcap, causal, MQA
    (1, 40, 60, 4, 2, 9, 9, False, (7, 4), 3.0),  # softcap, window, GQA
    (1, 1, 1, 2, 2, 8, 8, False, (-1, -1), 0.0),  # seqlen 1
    (2, 1, 60, 3, 3, 7, 7, True, (-1, -1), 0.0),  # one query
    (2, 60, 1, 3, 3, 7, 7, True, (-1, -1), 0.0),  # one key: only the last query sees it
    (1, 25, 40, 2, 2, 1, 1, False, (-1, -1), 0.0),  # head dim 1
    (1, 25, 40, 2, 2, 13, 5, True, (3, 3), 0.0),  # odd head dims, v's differs from q's
]
_ATTN_IDS = ["-".join(map(str, c)) for c in ATTN_CASES]


def attn_args(case):
    batch, sq, sk, h, hk, hd, hd_v, causal, window, softcap = case
    return (batch, sq, sk, h, hk, hd, hd_v, softcap), {
        "softmax_scale": 0.37,
        "causal": causal,
        "window_size": window,
        "softcap": softcap,
    }


def attn_grads(qkv, dout, opts, accum_dtype=np.float64):
    out, lse = ref.flash_attn_func(*qkv, **opts, return_lse=True, accum_dtype=accum_dtype)
    return bwd.flash_attn_bwd(dout, *qkv, out, lse, **opts, accum_dtype=accum_dtype)


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ATTN_IDS)
def test_attention_grads_match_finite_differences(case):
    shape, opts = attn_args(case)
    qkv, dout = attn_problem(*shape)
    copies = [a.copy() for a in (*qkv, dout)]
    grads = attn_grads(qkv, dout, opts)
    for a, c in zip((*qkv, dout), copies):
        assert np.array_equal(a, c)
    for grad, x in zip(grads, qkv):
        assert grad.dtype == np.float64 and grad.shape == x.shape

    def loss(xs):
        return float(np.sum(dout * ref.flash_attn_func(*xs, **opts, accum_dtype=np.float64)))

    fd_check(loss, qkv, grads, ["dq", "dk", "dv"], 1e-8)


def test_attention_empty_rows_get_zero_gradient():
    """Causal with seqlen_q > seqlen_k: the first rows see no key; their dq is exactly 0, and
    keys no query sees (left window) get dk = dv = 0."""
    qkv, dout = attn_problem(2, 40, 25, 4, 2, 8, 8, 0.0)
    opts = {"causal": True, "window_size": (5, -1)}
    out, lse = ref.flash_attn_func(*qkv, **opts, return_lse=True)
    assert np.isneginf(lse[:, :, :15]).all()
    dq, dk, dv = bwd.flash_attn_bwd(dout, *qkv, out, lse, **opts, accum_dtype=np.float64)
    assert all(np.isfinite(a).all() for a in (dq, dk, dv))
    # Row 15 sees key 0 alone: softmax is constant there, so its dq is ~0 too.
    assert (dq[:, :15] == 0).all() and (dq[:, 16:] != 0).all()
    # Query row i (key position i - 15) sees keys i - 20 .. i - 15: key 0 .. 19 all seen.
    assert (dk != 0).any(axis=(0, 2, 3)).all()
    qkv, dout = attn_problem(1, 10, 40, 2, 2, 8, 8, 0.0)
    out, lse = ref.flash_attn_func(*qkv, causal=True, window_size=(4, -1), return_lse=True)
    dq, dk, dv = bwd.flash_attn_bwd(dout, *qkv, out, lse, causal=True, window_size=(4, -1))
    assert (dk[:, :26] == 0).all() and (dv[:, :26] == 0).all()  # keys before 30 - 4
    assert (dk[:, 26:] != 0).all() and (dv[:, 26:] != 0).all()


def test_attention_float64_refines_float32_lse():
    """In float64 the float32 lse is refined: the gradients equal those from the exact lse,
    and an lse with an offset (scale of P) changes nothing."""
    qkv, dout = attn_problem(2, 50, 90, 4, 2, 16, 16, 2.0)
    opts = {"causal": True, "window_size": (30, -1), "softcap": 2.0}
    out, lse32 = ref.flash_attn_func(*qkv, **opts, return_lse=True, accum_dtype=np.float64)
    k = np.repeat(qkv[1], 2, axis=2)  # the exact lse, from the full score matrix
    s = np.einsum("bihd,bjhd->bhij", qkv[0], k) / np.sqrt(16)
    s = 2.0 * np.tanh(s / 2.0)
    i = np.arange(50)[:, None] + 40
    j = np.arange(90)[None, :]
    s = np.where((j <= i) & (j >= i - 30), s, -np.inf)
    lse64 = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    assert not np.array_equal(lse64, lse32.astype(np.float64))
    want = bwd.flash_attn_bwd(dout, *qkv, out, lse64, **opts, accum_dtype=np.float64)
    for lse in (lse32, (lse64 + 0.01).astype(np.float32)):
        got = bwd.flash_attn_bwd(dout, *qkv, out, lse, **opts, accum_dtype=np.float64)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            assert rel_err(a, b) < 1e-12, name


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ATTN_IDS)
def test_attention_blocks_agree(case, monkeypatch):
    """Tiny tiles (many query and key blocks, skipped blocks, partial masks) == default tiles."""
    shape, opts = attn_args(case)
    qkv, dout = attn_problem(*shape)
    want = attn_grads(qkv, dout, opts)
    monkeypatch.setattr(bwd, "_BLOCK_K", 8)
    monkeypatch.setattr(bwd, "_BLOCK_Q_MAX", 5)
    got = attn_grads(qkv, dout, opts)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel_err(a, b) < 1e-12, name


@pytest.mark.parametrize("case", ATTN_CASES[::2], ids=_ATTN_IDS[::2])
def test_attention_float32_matches_float64(case):
    shape, opts = attn_args(case)
    qkv, dout = attn_problem(*shape)
    want = attn_grads(qkv, dout, opts)
    qkv32 = [a.astype(np.float32) for a in qkv]
    got = attn_grads(qkv32, dout.astype(np.float32), opts, accum_dtype=np.float32)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.dtype == np.float32, name
        assert rel_err(a, b) < 1e-4, name


def test_attention_float16_inputs_and_default_scale():
    qkv, dout = attn_problem(2, 30, 70, 4, 1, 16, 16, 0.0)
    q16 = [a.astype(np.float16) for a in qkv]
    out, lse = ref.flash_attn_func(*q16, causal=True, return_lse=True)
    got = bwd.flash_attn_bwd(dout.astype(np.float16), *q16, out, lse, causal=True)
    q64 = [a.astype(np.float64) for a in q16]
    out64, lse64 = ref.flash_attn_func(*q64, causal=True, return_lse=True, accum_dtype=np.float64)
    want = bwd.flash_attn_bwd(
        dout.astype(np.float16).astype(np.float64), *q64, out64, lse64, causal=True,
        accum_dtype=np.float64,
    )  # fmt: skip
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.dtype == np.float16, name
        assert rel_err(a, b) < 5e-3, name  # float16 out and dout roundings


@pytest.mark.parametrize("shape", [(0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_attention_empty(shape):
    batch, sq, sk = shape
    qkv, dout = attn_problem(batch, sq, sk, 2, 1, 8, 8, 0.0, np.float32)
    out, lse = ref.flash_attn_func(*qkv, causal=True, return_lse=True)
    grads = bwd.flash_attn_bwd(dout, *qkv, out, lse, causal=True)
    for grad, x in zip(grads, qkv):
        assert grad.shape == x.shape and (grad == 0).all()


def test_attention_memory_is_blockwise():
    """seqlen 2048 x 2048: the score matrix alone would take 32 MiB in float64."""
    qkv, dout = attn_problem(1, 2048, 2048, 1, 1, 16, 16, 0.0)
    out, lse = ref.flash_attn_func(*qkv, causal=True, return_lse=True, accum_dtype=np.float64)
    tracemalloc.start()
    try:
        bwd.flash_attn_bwd(dout, *qkv, out, lse, causal=True, accum_dtype=np.float64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 << 20, f"peak {peak / 2**20:.1f} MiB"


# --------------------------------------------------------------------------------------------
# Selective scan
# --------------------------------------------------------------------------------------------

SCAN_NAMES = ["du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dinitial_state"]


def bc_matrix(g, kind, batch, dim, dstate, seqlen):
    if kind == "fixed":
        return g.standard_normal((dim, dstate))
    if kind == "varying":
        return g.standard_normal((batch, dstate, seqlen))
    groups = int(kind[len("groups") :])
    return g.standard_normal((batch, groups, dstate, seqlen))


def scan_problem(batch, dim, dstate, seqlen, b_kind, c_kind, options, dtype=np.float64):
    """(inputs, keyword flags, dout, dlast); inputs in the order of SCAN_NAMES, None where an
    option is off."""
    use_d, use_z, use_bias, sp, use_x0, use_dlast = options
    g = rng()
    u = g.standard_normal((batch, dim, seqlen))
    if sp:
        delta = g.standard_normal((batch, dim, seqlen)) - 1.0
    else:
        delta = g.uniform(0.51, 1.0, (batch, dim, seqlen))
    xs = [
        u,
        delta,
        -np.exp(g.standard_normal((dim, dstate)) * 0.7),
        bc_matrix(g, b_kind, batch, dim, dstate, seqlen),
        bc_matrix(g, c_kind, batch, dim, dstate, seqlen),
        g.standard_normal(dim) if use_d else None,
        g.standard_normal((batch, dim, seqlen)) if use_z else None,
        g.uniform(-0.5, 0.5, dim) if use_bias else None,
        g.standard_normal((batch, dim, dstate)) if use_x0 else None,
    ]
    xs = [None if x is None else x.astype(dtype) for x in xs]
    dout = g.standard_normal((batch, dim, seqlen)).astype(dtype)
    dlast = g.standard_normal((batch, dim, dstate)).astype(dtype) if use_dlast else None
    return xs, sp, dout, dlast


def scan_forward(xs, sp):
    u, delta, A, B, C, D, z, bias, x0 = xs
    return ref.selective_scan_fn(
        u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=sp,
        return_last_state=True, initial_state=x0,
    )  # fmt: skip


def scan_grads(xs, sp, dout, dlast):
    u, delta, A, B, C, D, z, bias, x0 = xs
    return bwd.selective_scan_bwd(
        dout, u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=sp,
        initial_state=x0, dlast_state=dlast,
    )  # fmt: skip


# (batch, dim, dstate, seqlen, B kind, C kind)
SCAN_SHAPES = [
    (2, 6, 16, 1, "fixed", "fixed"),
    (2, 6, 16, 7, "varying", "varying"),
    (1, 8, 1, 65, "groups2", "groups2"),
    (2, 12, 4, 65, "groups3", "varying"),
    (2, 8, 16, 40, "fixed", "varying"),
    (2, 8, 16, 40, "groups4", "fixed"),
    (1, 12, 3, 21, "groups2", "groups3"),  # different group counts for B and C
    (2, 4, 1, 7, "varying", "groups4"),  # one channel per group
]

# (D, z, delta_bias, softplus, initial_state, dlast_state)
SCAN_OPTIONS = [
    (False, False, False, False, False, False),
    (True, True, True, True, True, True),
    (True, False, False, True, False, True),
    (False, True, True, False, True, False),
]
_SHAPE_IDS = ["-".join(map(str, c)) for c in SCAN_SHAPES]


def _option_id(o):
    return "".join("01"[x] for x in o)


@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=_SHAPE_IDS)
@pytest.mark.parametrize("options", SCAN_OPTIONS, ids=_option_id)
@pytest.mark.parametrize("chunk", [None, 3])
def test_scan_grads_match_finite_differences(shape, options, chunk, monkeypatch):
    batch, dim, dstate = shape[:3]
    if chunk is not None:  # chunks of `chunk` steps: several chunks and super-chunks
        monkeypatch.setattr(bwd, "_SCAN_BUDGET", chunk * batch * dim * dstate)
    xs, sp, dout, dlast = scan_problem(*shape, options)
    copies = [None if x is None else x.copy() for x in (*xs, dout, dlast)]
    grads = scan_grads(xs, sp, dout, dlast)
    for x, c in zip((*xs, dout, dlast), copies):
        assert x is None or np.array_equal(x, c)
    assert len(grads) == len(SCAN_NAMES)
    for grad, x, name in zip(grads, xs, SCAN_NAMES):
        assert (grad is None) == (x is None), name
        if grad is not None:
            assert grad.dtype == np.float64 and grad.shape == x.shape, name

    def loss(ys):
        out, last = scan_forward(ys, sp)
        total = float(np.sum(dout * out))
        if dlast is not None:
            total += float(np.sum(dlast * last))
        return total

    used = [i for i, x in enumerate(xs) if x is not None]
    fd_check(
        lambda ys: loss(_fill(xs, used, ys)),
        [xs[i] for i in used],
        [grads[i] for i in used],
        [SCAN_NAMES[i] for i in used],
        # 1e-7, not 1e-8: A enters through exp(delta A) over up to 65 steps, and the 4th-order
        # difference's truncation error reached 1.35e-8 of the terms for dA on one draw (the
        # draw depends on which tests a worker ran first); a wrong gradient is off by O(1)
        1e-7,
    )


def _fill(xs, used, ys):
    full = list(xs)
    for i, y in zip(used, ys):
        full[i] = y
    return full


def test_scan_dlast_state_none_is_zero():
    xs, sp, dout, _ = scan_problem(2, 6, 4, 9, "varying", "fixed", (True,) * 6)
    a = scan_grads(xs, sp, dout, None)
    b = scan_grads(xs, sp, dout, np.zeros((2, 6, 4)))
    for name, x, y in zip(SCAN_NAMES, a, b):
        assert np.array_equal(x, y), name


def test_scan_dlast_state_alone():
    """With dout = 0 only the last state carries gradient: d last / d initial_state is the
    product of the step decays, elementwise."""
    xs, sp, dout, dlast = scan_problem(2, 6, 4, 9, "varying", "varying", (True,) * 6)
    grads = scan_grads(xs, sp, np.zeros_like(dout), dlast)
    u, delta, A, _, _, _, _, bias, _ = xs
    dt = np.log1p(np.exp(delta + bias[:, None]))
    decay = np.exp(dt.sum(axis=-1)[..., None] * A)
    assert rel_err(grads[8], decay * dlast) < 1e-12
    assert (grads[5] == 0).all() and (grads[6] == 0).all()  # dD, dz


@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=_SHAPE_IDS)
def test_scan_chunks_agree(shape, monkeypatch):
    """One step per chunk, short chunks with ragged tails, and one chunk agree (seqlen 103)."""
    batch, dim, dstate = shape[:3]
    shape = (*shape[:3], 103, *shape[4:])
    xs, sp, dout, dlast = scan_problem(*shape, SCAN_OPTIONS[1])
    want = scan_grads(xs, sp, dout, dlast)
    for chunk in (1, 4, 10):
        monkeypatch.setattr(bwd, "_SCAN_BUDGET", chunk * batch * dim * dstate)
        got = scan_grads(xs, sp, dout, dlast)
        for name, a, b in zip(SCAN_NAMES, got, want):
            assert rel_err(a, b) < 1e-12, (chunk, name)


@pytest.mark.parametrize("shape", SCAN_SHAPES[1::2], ids=_SHAPE_IDS[1::2])
def test_scan_float32_matches_float64(shape):
    shape = (*shape[:3], max(shape[3], 50), *shape[4:])
    xs, sp, dout, dlast = scan_problem(*shape, SCAN_OPTIONS[1])
    want = scan_grads(xs, sp, dout, dlast)
    xs32 = [None if x is None else x.astype(np.float32) for x in xs]
    got = scan_grads(xs32, sp, dout.astype(np.float32), dlast.astype(np.float32))
    for name, a, b in zip(SCAN_NAMES, got, want):
        assert a.dtype == np.float32, name
        assert rel_err(a, b) < 1e-4, name


def test_scan_float16_inputs_keep_their_dtypes():
    xs, sp, dout, dlast = scan_problem(2, 8, 16, 30, "varying", "varying", SCAN_OPTIONS[1])
    xs16 = list(xs)
    for i in (0, 1, 3, 4, 6):  # u, delta, B, C, z
        xs16[i] = xs[i].astype(np.float16)
    for i in (2, 5, 7, 8):
        xs16[i] = xs[i].astype(np.float32)
    got = scan_grads(xs16, sp, dout.astype(np.float16), dlast)
    want = scan_grads([x.astype(np.float64) for x in xs16], sp, dout.astype(np.float16), dlast)
    dtypes = [np.float16, np.float16] + [np.float32] * 4 + [np.float16] + [np.float32] * 2
    for name, a, b, dt in zip(SCAN_NAMES, got, want, dtypes):
        assert a.dtype == dt, name
        assert rel_err(a, b) < 2e-3, name


@pytest.mark.parametrize("shape", [(0, 4, 16, 9), (2, 4, 16, 0)])
def test_scan_empty(shape):
    xs, sp, dout, dlast = scan_problem(*shape, "varying", "varying", SCAN_OPTIONS[1])
    grads = scan_grads(xs, sp, dout, dlast)
    for grad, x, name in zip(grads, xs, SCAN_NAMES):
        assert grad.shape == x.shape, name
    assert np.array_equal(grads[8], dlast)  # seqlen 0: the last state is the initial one


def test_scan_long_sequence_is_fast_and_bounded():
    """seqlen 4096, batch 2, dim 64, dstate 16 in well under the time of a test; the states of
    a long sequence are never all held (8192 x 8 x 128 float32 states: 32 MiB)."""
    xs, sp, dout, dlast = scan_problem(2, 64, 16, 4096, "varying", "varying", SCAN_OPTIONS[1])
    xs = [x.astype(np.float32) for x in xs]
    t = time.perf_counter()
    grads = scan_grads(xs, sp, dout.astype(np.float32), dlast.astype(np.float32))
    assert time.perf_counter() - t < 5.0
    assert all(np.isfinite(a).all() for a in grads)

    xs, sp, dout, dlast = scan_problem(1, 8, 128, 8192, "fixed", "fixed", SCAN_OPTIONS[1])
    xs = [x.astype(np.float32) for x in xs]
    dout = dout.astype(np.float32)
    tracemalloc.start()
    try:
        scan_grads(xs, sp, dout, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"


# --------------------------------------------------------------------------------------------
# Against torch autograd (float64), where torch is installed
# --------------------------------------------------------------------------------------------


def torch_attention(q, k, v, scale, causal, window, softcap):
    """Plain float64 attention on (batch, seqlen, heads, headdim) torch tensors."""
    import torch

    sq, nheads, sk, nheads_k = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    group = nheads // nheads_k
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    s = torch.where(visible, s, torch.tensor(float("-inf"), dtype=s.dtype))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.einsum("bhij,bjhd->bihd", p, v)


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ATTN_IDS)
def test_attention_matches_torch_autograd(case):
    torch = pytest.importorskip("torch")
    shape, opts = attn_args(case)
    qkv, dout = attn_problem(*shape)
    want_in = [torch.tensor(a, requires_grad=True) for a in qkv]
    out = torch_attention(
        *want_in, opts["softmax_scale"], opts["causal"], opts["window_size"], opts["softcap"]
    )
    want = torch.autograd.grad(out, want_in, grad_outputs=torch.tensor(dout))
    got = attn_grads(qkv, dout, opts)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel_err(a, b.numpy()) < 1e-10, name


def torch_scan(u, delta, A, B, C, D, z, delta_bias, softplus, x0):
    """Per-step float64 loop on torch tensors; returns (out, last_state)."""
    import torch

    batch, dim, seqlen = u.shape
    dt = delta if delta_bias is None else delta + delta_bias[:, None]
    if softplus:
        dt = torch.where(dt <= 20.0, torch.log1p(torch.exp(torch.clamp(dt, max=20.0))), dt)

    def at(m, t):  # (batch or 1, dim, dstate)
        if m.dim() == 2:
            return m[None]
        if m.dim() == 3:
            return m[:, None, :, t]
        return m[:, :, :, t].repeat_interleave(dim // m.shape[1], dim=1)

    x = torch.zeros(batch, dim, A.shape[1], dtype=u.dtype) if x0 is None else x0
    ys = []
    for t in range(seqlen):
        dt_t = dt[:, :, t, None]
        x = torch.exp(dt_t * A) * x + dt_t * at(B, t) * u[:, :, t, None]
        y = (x * at(C, t)).sum(dim=-1)
        if D is not None:
            y = y + D * u[:, :, t]
        if z is not None:
            y = y * torch.nn.functional.silu(z[:, :, t])
        ys.append(y)
    return torch.stack(ys, dim=-1), x


@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=_SHAPE_IDS)
@pytest.mark.parametrize("options", SCAN_OPTIONS, ids=_option_id)
def test_scan_matches_torch_autograd(shape, options):
    torch = pytest.importorskip("torch")
    xs, sp, dout, dlast = scan_problem(*shape, options)
    tin = [None if x is None else torch.tensor(x, requires_grad=True) for x in xs]
    out, last = torch_scan(*tin[:8], sp, tin[8])
    loss = (out * torch.tensor(dout)).sum()
    if dlast is not None:
        loss = loss + (last * torch.tensor(dlast)).sum()
    used = [t for t in tin if t is not None]
    want = iter(torch.autograd.grad(loss, used, allow_unused=True))
    got = scan_grads(xs, sp, dout, dlast)
    for name, a, t in zip(SCAN_NAMES, got, tin):
        if t is None:
            assert a is None, name
            continue
        b = next(want)
        b = np.zeros(a.shape) if b is None else b.numpy()
        assert rel_err(a, b) < 1e-10, name
