"""CPU tests of `flash_attn_with_kvcache`: the NumPy reference against a naive float64 loop, the
public API on NumPy and torch CPU arrays, every bad input, and the CUDA dispatch (a fake CUDA
framework and a fake native module: the native calls, the fallback policy, the host copy-back
of the caches, float32 refused by the native core, a native module without the decode entries).

Inputs are random (never zeros), caches full of random values beyond the valid lengths (a
kernel or reference reading a slot it should not changes the result), lengths ragged with 0
and 1 among them.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import flashscan
from flashscan import _backend, _frameworks, kvcache, reference_kvcache
from flashscan._frameworks import NumpyHandler

F64 = np.float64

# ---------------------------------------------------------------------------------------------
# The naive float64 loop (independent of the reference: one query, one head, one key at a time)
# ---------------------------------------------------------------------------------------------


def naive_rotate(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: int, interleaved: bool
) -> np.ndarray:
    y = np.array(x, dtype=F64)
    half = cos.shape[1]
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        c, s = float(cos[pos, i]), float(sin[pos, i])
        y[a] = x[a] * c - x[b] * s
        y[b] = x[a] * s + x[b] * c
    return y


def naive_kvcache(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    k: np.ndarray | None = None,
    v: np.ndarray | None = None,
    rotary_cos: np.ndarray | None = None,
    rotary_sin: np.ndarray | None = None,
    cache_seqlens: Any = None,
    cache_batch_idx: np.ndarray | None = None,
    cache_leftpad: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    num_splits: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(out, lse, k_cache after, v_cache after) in float64; the given caches are not touched.
    (num_splits only divides the GPU's work.)"""
    kc, vc = k_cache.copy(), v_cache.copy()
    b, sq, h, d = q.shape
    hk = kc.shape[2]
    bs = kc.shape[1]
    capacity = block_table.shape[1] * bs if block_table is not None else kc.shape[1]
    sn = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        lens = [capacity] * b
    elif np.ndim(cache_seqlens) == 0:
        lens = [int(cache_seqlens)] * b
    else:
        lens = [int(x) for x in cache_seqlens]
    pad = [0] * b if cache_leftpad is None else [int(x) for x in cache_leftpad]

    def slot(bi: int, p: int) -> tuple[int, int]:
        if block_table is not None:
            return int(block_table[bi, p // bs]), p % bs
        return (bi if cache_batch_idx is None else int(cache_batch_idx[bi])), p

    rot = rotary_cos is not None
    for bi in range(b):
        for i in range(sn):
            p = lens[bi] + i
            r, s = slot(bi, p)
            for j in range(hk):
                key = k[bi, i, j].astype(F64)  # type: ignore[index]
                if rot:
                    key = naive_rotate(key, rotary_cos, rotary_sin, p - pad[bi], rotary_interleaved)
                kc[r, s, j] = key
                vc[r, s, j] = v[bi, i, j]  # type: ignore[index]

    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    left, right = window_size
    if causal:
        right = 0
    out = np.zeros((b, sq, h, d))
    lse = np.full((b, h, sq), -np.inf)
    for bi in range(b):
        keys = [slot(bi, p) for p in range(pad[bi], lens[bi] + sn)]
        n = len(keys)
        for hh in range(h):
            j = hh // (h // hk)
            K = np.array([kc[r, s, j] for r, s in keys], dtype=F64).reshape(n, d)
            V = np.array([vc[r, s, j] for r, s in keys], dtype=F64).reshape(n, d)
            for i in range(sq):
                qv = q[bi, i, hh].astype(F64)
                if rot:
                    pos = lens[bi] - pad[bi] + i
                    qv = naive_rotate(qv, rotary_cos, rotary_sin, pos, rotary_interleaved)
                    qv = qv.astype(q.dtype).astype(F64)
                at = n - sq + i  # bottom-right: query i sits at key position n - sq + i
                vis = [
                    (right < 0 or t <= at + right) and (left < 0 or t >= at - left)
                    for t in range(n)
                ]
                if not any(vis):
                    continue
                s = K[vis] @ qv * scale
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                m = s.max()
                p = np.exp(s - m)
                out[bi, i, hh] = p @ V[vis] / p.sum()
                lse[bi, hh, i] = m + math.log(p.sum())
    return out, lse, kc, vc


# ---------------------------------------------------------------------------------------------
# Random cases
# ---------------------------------------------------------------------------------------------


def rotary_tables(
    rng: np.random.Generator, seqlen_ro: int, rotary_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    freq = rng.uniform(0.01, 1.0, rotary_dim // 2)
    ang = np.arange(seqlen_ro)[:, None] * freq[None, :] + rng.uniform(0, 1, rotary_dim // 2)
    return np.cos(ang), np.sin(ang)


def make_case(
    rng: np.random.Generator,
    *,
    batch: int = 3,
    seqlen_q: int = 1,
    seqlen_new: int = 1,
    nheads: int = 4,
    nheads_k: int = 2,
    headdim: int = 16,
    capacity: int = 40,
    block_size: int | None = None,
    rotary_dim: int | None = None,
    leftpad: bool = False,
    batch_idx: bool = False,
    dtype: Any = F64,
) -> dict[str, Any]:
    """Keyword arguments of flash_attn_with_kvcache (NumPy). Lengths are ragged, with 0 and 1
    among them; the whole cache holds random values."""
    lens = rng.integers(0, capacity - seqlen_new + 1, batch)
    lens[: min(batch, 2)] = [0, 1][: min(batch, 2)]
    lens = np.minimum(lens, capacity - seqlen_new)
    a: dict[str, Any] = {
        "q": rng.standard_normal((batch, seqlen_q, nheads, headdim)),
        "cache_seqlens": lens.astype(np.int32),
    }
    if block_size is None:
        rows = batch + (2 if batch_idx else 0)
        shape: tuple[int, ...] = (rows, capacity, nheads_k, headdim)
        if batch_idx:
            a["cache_batch_idx"] = rng.permutation(rows)[:batch].astype(np.int32)
    else:
        assert capacity % block_size == 0
        max_blocks = capacity // block_size
        nblocks = batch * max_blocks + 3
        shape = (nblocks, block_size, nheads_k, headdim)
        ids = rng.permutation(nblocks)[: batch * max_blocks]
        a["block_table"] = ids.reshape(batch, max_blocks).astype(np.int32)
    a["k_cache"] = rng.standard_normal(shape)
    a["v_cache"] = rng.standard_normal(shape)
    if seqlen_new:
        a["k"] = rng.standard_normal((batch, seqlen_new, nheads_k, headdim))
        a["v"] = rng.standard_normal((batch, seqlen_new, nheads_k, headdim))
    if leftpad:
        a["cache_leftpad"] = (rng.uniform(0, 1, batch) * (lens + 1)).astype(np.int32)
        a["cache_leftpad"] = np.minimum(a["cache_leftpad"], lens).astype(np.int32)
    if rotary_dim:
        a["rotary_cos"], a["rotary_sin"] = rotary_tables(rng, capacity + seqlen_q, rotary_dim)
    for key in ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin"):
        if key in a:
            a[key] = a[key].astype(dtype)
    return a


def copied(a: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.items()}


def check_against_naive(
    a: dict[str, Any], opts: dict[str, Any], call: Callable[..., Any], tol: float = 1e-10
) -> None:
    """call(**a, **opts, return_lse=True) against the naive loop on copies of the inputs,
    output, lse and both caches."""
    ref_out, ref_lse, ref_kc, ref_vc = naive_kvcache(**copied(a), **opts)
    out, lse = call(**a, **opts, return_lse=True)
    out, lse = np.asarray(out, dtype=F64), np.asarray(lse, dtype=F64)
    scale = max(1.0, float(np.abs(ref_out).max()))
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * scale)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a["k_cache"].astype(F64), ref_kc.astype(F64), rtol=0, atol=tol)
    np.testing.assert_array_equal(a["v_cache"], ref_vc)


# ---------------------------------------------------------------------------------------------
# The reference against the naive loop
# ---------------------------------------------------------------------------------------------

CASES = [
    # (batch, seqlen_q, seqlen_new, nheads, nheads_k, headdim, capacity, block_size)
    (3, 1, 1, 4, 4, 16, 40, None),
    (4, 1, 1, 8, 2, 32, 64, 16),
    (2, 4, 4, 8, 1, 8, 48, None),
    (3, 13, 13, 4, 4, 16, 64, 32),
    (3, 7, 0, 8, 1, 16, 33, None),
    (2, 3, 5, 4, 1, 24, 64, 64),
    (5, 2, 1, 16, 2, 8, 20, None),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", ["none", "causal", "window", "softcap"])
def test_reference_matches_naive(case: tuple, mask: str, rng: np.random.Generator) -> None:
    b, sq, sn, h, hk, d, cap, bs = case
    a = make_case(
        rng,
        batch=b,
        seqlen_q=sq,
        seqlen_new=sn,
        nheads=h,
        nheads_k=hk,
        headdim=d,
        capacity=cap,
        block_size=bs,
    )
    opts: dict[str, Any] = {
        "none": {},
        "causal": {"causal": True},
        "window": {"window_size": (5, 1), "softmax_scale": 0.3},
        "softcap": {"softcap": 2.5, "causal": True, "window_size": (9, -1)},
    }[mask]
    check_against_naive(a, opts, reference_kvcache.flash_attn_with_kvcache)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [8, 16, 32])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_reference_rotary(
    interleaved: bool, rotary_dim: int, layout: str, rng: np.random.Generator
) -> None:
    a = make_case(
        rng,
        batch=3,
        seqlen_q=3,
        seqlen_new=2,
        headdim=32,
        capacity=64,
        block_size=16 if layout == "paged" else None,
        rotary_dim=rotary_dim,
        leftpad=layout == "contiguous",
    )
    check_against_naive(
        a,
        {"rotary_interleaved": interleaved, "causal": True},
        reference_kvcache.flash_attn_with_kvcache,
    )


def test_reference_rotary_without_new_keys(rng: np.random.Generator) -> None:
    """Rotary with k=None: q alone is rotated, at cache_seqlens - leftpad + i."""
    a = make_case(rng, seqlen_q=4, seqlen_new=0, headdim=16, rotary_dim=12, leftpad=True)
    check_against_naive(a, {"rotary_interleaved": False}, reference_kvcache.flash_attn_with_kvcache)


def test_reference_leftpad_and_batch_idx(rng: np.random.Generator) -> None:
    a = make_case(rng, batch=4, seqlen_q=2, seqlen_new=2, leftpad=True, batch_idx=True)
    check_against_naive(a, {"causal": True}, reference_kvcache.flash_attn_with_kvcache)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_reference_gqa(group: int, rng: np.random.Generator) -> None:
    a = make_case(rng, batch=2, seqlen_q=5, seqlen_new=3, nheads=2 * group, nheads_k=2)
    check_against_naive(a, {"causal": True}, reference_kvcache.flash_attn_with_kvcache)


@pytest.mark.parametrize("seqlen_q", list(range(1, 14)))
def test_reference_seqlen_q(seqlen_q: int, rng: np.random.Generator) -> None:
    a = make_case(rng, batch=2, seqlen_q=seqlen_q, seqlen_new=min(seqlen_q, 3), capacity=32)
    check_against_naive(a, {"causal": True}, reference_kvcache.flash_attn_with_kvcache)


def test_reference_float16_rounds_like_the_cache(rng: np.random.Generator) -> None:
    """float16 inputs: the rotated keys are rounded into the float16 cache, q rounded after its
    rotation; the naive loop does the same, so they agree closely."""
    a = make_case(rng, seqlen_q=2, seqlen_new=2, rotary_dim=16, dtype=np.float16)
    check_against_naive(a, {"causal": True}, reference_kvcache.flash_attn_with_kvcache, tol=2e-3)
    assert a["k_cache"].dtype == np.float16


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_paged_equals_contiguous(block_size: int, rng: np.random.Generator) -> None:
    """The same sequences in a contiguous cache and in a paged one with a shuffled block table:
    identical outputs and identical cache contents."""
    b, hk, d, max_blocks = 3, 2, 16, 3
    capacity = block_size * max_blocks
    a = make_case(
        rng,
        batch=b,
        seqlen_q=3,
        seqlen_new=2,
        headdim=d,
        nheads_k=hk,
        capacity=capacity,
        rotary_dim=8,
    )
    a["cache_seqlens"][-1] = capacity - 2  # one sequence fills its last block
    nblocks = b * max_blocks + 5
    bt = rng.permutation(nblocks)[: b * max_blocks].reshape(b, max_blocks).astype(np.int32)
    pk = rng.standard_normal((nblocks, block_size, hk, d))
    pv = rng.standard_normal((nblocks, block_size, hk, d))
    for bi in range(b):
        for j in range(max_blocks):
            sl = slice(j * block_size, (j + 1) * block_size)
            pk[bt[bi, j]], pv[bt[bi, j]] = a["k_cache"][bi, sl], a["v_cache"][bi, sl]
    p = dict(a, k_cache=pk, v_cache=pv, block_table=bt)
    opts = {"causal": True, "return_lse": True}
    o1, l1 = reference_kvcache.flash_attn_with_kvcache(**a, **opts)
    o2, l2 = reference_kvcache.flash_attn_with_kvcache(**p, **opts)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(l1, l2)
    for bi in range(b):
        for j in range(max_blocks):
            sl = slice(j * block_size, (j + 1) * block_size)
            np.testing.assert_array_equal(pk[bt[bi, j]], a["k_cache"][bi, sl])
            np.testing.assert_array_equal(pv[bt[bi, j]], a["v_cache"][bi, sl])


def test_appended_cache_contents_exact(rng: np.random.Generator) -> None:
    """Without rotary the new k/v land bit for bit at cache_seqlens[b] + i, paged or not, and
    no other slot changes."""
    for block_size in (None, 16):
        a = make_case(rng, batch=4, seqlen_new=5, capacity=48, block_size=block_size)
        a = {k: (v.astype(np.float16) if v.dtype.kind == "f" else v) for k, v in a.items()}
        kc0, vc0 = a["k_cache"].copy(), a["v_cache"].copy()
        reference_kvcache.flash_attn_with_kvcache(**a)
        written = np.zeros(kc0.shape[:2], dtype=bool)
        for bi in range(4):
            for i in range(5):
                p = int(a["cache_seqlens"][bi]) + i
                r, s = (bi, p) if block_size is None else (a["block_table"][bi, p // 16], p % 16)
                assert np.array_equal(a["k_cache"][r, s], a["k"][bi, i])
                assert np.array_equal(a["v_cache"][r, s], a["v"][bi, i])
                written[r, s] = True
        assert np.array_equal(a["k_cache"][~written], kc0[~written])
        assert np.array_equal(a["v_cache"][~written], vc0[~written])


def test_a_query_that_sees_no_key(rng: np.random.Generator) -> None:
    """An empty cache and no new keys: out 0, lse -inf; so does a window that excludes all."""
    a = make_case(rng, batch=2, seqlen_q=2, seqlen_new=0)
    a["cache_seqlens"] = np.array([0, 7], np.int32)
    out, lse = reference_kvcache.flash_attn_with_kvcache(**a, return_lse=True)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.all(np.isfinite(lse[1])) and np.abs(out[1]).max() > 0
    # leftpad == cache_seqlens: nothing valid either
    a["cache_leftpad"] = np.array([0, 7], np.int32)
    out, lse = reference_kvcache.flash_attn_with_kvcache(**a, return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    check_against_naive(
        dict(a, cache_leftpad=None),
        {"window_size": (0, -1), "causal": True},
        reference_kvcache.flash_attn_with_kvcache,
    )


def test_cache_seqlens_int_and_none(rng: np.random.Generator) -> None:
    a = make_case(rng, batch=3, seqlen_new=2, capacity=32)
    a["cache_seqlens"] = 9
    check_against_naive(a, {}, reference_kvcache.flash_attn_with_kvcache)
    b = make_case(rng, batch=2, seqlen_new=0, capacity=24)
    b["cache_seqlens"] = None
    check_against_naive(b, {"causal": True}, reference_kvcache.flash_attn_with_kvcache)


def test_apply_rotary_layouts() -> None:
    """A pair rotated by 90 degrees: (a, b) -> (-b, a), in both layouts."""
    x = np.arange(1.0, 9.0).reshape(1, 1, 8)
    cos, sin = np.zeros((1, 2)), np.ones((1, 2))
    y = reference_kvcache.apply_rotary(x, cos, sin, np.array([0]), interleaved=True)
    assert y.ravel().tolist() == [-2, 1, -4, 3, 5, 6, 7, 8]
    y = reference_kvcache.apply_rotary(x, cos, sin, np.array([0]), interleaved=False)
    assert y.ravel().tolist() == [-3, -4, 1, 2, 5, 6, 7, 8]


# ---------------------------------------------------------------------------------------------
# The public API on NumPy and torch CPU arrays
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_api_numpy(dtype: Any, rng: np.random.Generator) -> None:
    a = make_case(
        rng,
        batch=3,
        seqlen_q=2,
        seqlen_new=2,
        nheads=8,
        nheads_k=2,
        headdim=32,
        capacity=64,
        block_size=16,
        rotary_dim=16,
        dtype=dtype,
    )
    kc = a["k_cache"]
    tol = 1e-5 if dtype == np.float32 else 3e-3
    check_against_naive(
        a,
        {"causal": True, "rotary_interleaved": False, "num_splits": 3},
        flashscan.flash_attn_with_kvcache,
        tol=tol,
    )
    assert a["k_cache"] is kc  # updated in place


def test_api_numpy_out_and_no_lse(rng: np.random.Generator) -> None:
    a = make_case(rng, dtype=np.float32)
    ref = naive_kvcache(**copied(a))[0]
    out = np.full(a["q"].shape, np.nan, np.float32)
    res = flashscan.flash_attn_with_kvcache(**a, out=out)
    assert res is out
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_api_int_cache_seqlens_is_broadcast(rng: np.random.Generator) -> None:
    a = make_case(rng, batch=3, seqlen_new=1, dtype=np.float32)
    b = copied(a)
    a["cache_seqlens"] = 5
    b["cache_seqlens"] = np.full(3, 5, np.int32)
    o1 = flashscan.flash_attn_with_kvcache(**a)
    o2 = flashscan.flash_attn_with_kvcache(**b)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(a["k_cache"], b["k_cache"])


def test_api_batch_zero(rng: np.random.Generator) -> None:
    a = make_case(rng, batch=1, dtype=np.float32)
    a = {k: (v[:0] if k in ("q", "k", "v", "cache_seqlens") else v) for k, v in a.items()}
    kc = a["k_cache"].copy()
    out, lse = flashscan.flash_attn_with_kvcache(**a, return_lse=True)
    assert out.shape == (0, 1, 4, 16) and lse.shape == (0, 4, 1)
    assert np.array_equal(a["k_cache"], kc)


def test_api_torch_cpu(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        a = make_case(
            rng, batch=3, seqlen_q=2, seqlen_new=2, capacity=48, block_size=16, dtype=np.float32
        )
        t = {k: torch.from_numpy(v) for k, v in a.items()}
        for key in ("q", "k_cache", "v_cache", "k", "v"):
            t[key] = t[key].to(dt)
        ptr = t["k_cache"].data_ptr()
        rounded = {
            k: (v.double().numpy() if v.is_floating_point() else v.numpy()) for k, v in t.items()
        }
        ref_out, ref_lse, ref_kc, ref_vc = naive_kvcache(**rounded, causal=True)
        out, lse = flashscan.flash_attn_with_kvcache(**t, causal=True, return_lse=True)
        assert isinstance(out, torch.Tensor) and out.dtype == dt and out.shape == t["q"].shape
        assert lse.dtype == torch.float32 and lse.shape == (3, 4, 2)
        assert t["k_cache"].data_ptr() == ptr
        # no rotary: the caches hold exact copies of the new keys and values
        np.testing.assert_array_equal(t["k_cache"].double().numpy(), ref_kc)
        np.testing.assert_array_equal(t["v_cache"].double().numpy(), ref_vc)
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dt]
        np.testing.assert_allclose(out.double().numpy(), ref_out, rtol=0, atol=tol)
        np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-5, atol=1e-5)


def test_api_torch_cpu_rotary_and_int_lengths(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    a = make_case(
        rng, batch=2, seqlen_q=3, seqlen_new=3, rotary_dim=8, leftpad=True, dtype=np.float32
    )
    a["cache_seqlens"] = 4
    a["cache_leftpad"] = np.array([0, 3], np.int32)
    t = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in a.items()}
    ref_out, _, ref_kc, _ = naive_kvcache(**copied(a), causal=True)
    out = flashscan.flash_attn_with_kvcache(**t, causal=True)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-5)
    np.testing.assert_allclose(t["k_cache"].numpy(), ref_kc, rtol=0, atol=1e-6)


def test_failed_call_leaves_caches_untouched(rng: np.random.Generator) -> None:
    a = make_case(rng, batch=2, seqlen_new=2, block_size=16, capacity=32, dtype=np.float32)
    a["block_table"][1, 0] = 999
    before = copied(a)
    with pytest.raises(ValueError, match="block_table"):
        flashscan.flash_attn_with_kvcache(**a)
    for key in ("k_cache", "v_cache"):
        np.testing.assert_array_equal(a[key], before[key])


def test_unused_block_table_entries_are_not_checked(rng: np.random.Generator) -> None:
    """Entries past a sequence's length are never read: -1 padding there is fine."""
    a = make_case(rng, batch=2, seqlen_new=1, block_size=16, capacity=64, dtype=np.float32)
    a["cache_seqlens"] = np.array([3, 20], np.int32)
    a["block_table"][0, 1:] = -1
    a["block_table"][1, 2:] = -1
    check_against_naive(a, {}, flashscan.flash_attn_with_kvcache, tol=1e-5)


# ---------------------------------------------------------------------------------------------
# Bad input: the exception type, and the message names the argument
# ---------------------------------------------------------------------------------------------


def _base() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    a = make_case(rng, batch=2, seqlen_q=1, seqlen_new=1, capacity=32, dtype=np.float32)
    a["cache_seqlens"] = np.array([3, 5], np.int32)
    return a


def _paged() -> dict[str, Any]:
    rng = np.random.default_rng(8)
    a = make_case(rng, batch=2, seqlen_new=1, capacity=32, block_size=16, dtype=np.float32)
    a["cache_seqlens"] = np.array([3, 5], np.int32)
    return a


def _with(base: Callable[[], dict[str, Any]], **changes: Any) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        a = base()
        for k, v in changes.items():
            a[k] = v(a) if callable(v) else v
        return a

    return make


def _rot(seqlen_ro: int = 40, half: int = 4, dtype: Any = np.float32) -> Callable[[Any], Any]:
    return lambda a: np.random.default_rng(1).uniform(-1, 1, (seqlen_ro, half)).astype(dtype)


def _f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(2).standard_normal(shape).astype(np.float32)


def _readonly(a: dict[str, Any]) -> np.ndarray:
    kc = a["k_cache"].copy()
    kc.flags.writeable = False
    return kc


BAD: list[tuple[str, Callable[[], dict[str, Any]], type, list[str]]] = [
    ("q not an array", _with(_base, q=[1.0]), TypeError, ["q:", "expected an array"]),
    ("k_cache missing", _with(_base, k_cache=None), TypeError, ["k_cache:"]),
    ("q 3-D", _with(_base, q=lambda a: a["q"][0]), ValueError, ["q:", "4-D"]),
    ("q int", _with(_base, q=lambda a: a["q"].astype(np.int32)), TypeError, ["q:", "dtype"]),
    (
        "k_cache dtype",
        _with(_base, k_cache=lambda a: a["k_cache"].astype(np.float16)),
        TypeError,
        ["k_cache:", "float16", "float32"],
    ),
    (
        "v_cache shape",
        _with(_base, v_cache=lambda a: a["v_cache"][:, :16]),
        ValueError,
        ["v_cache:", "k_cache"],
    ),
    (
        "cache headdim",
        _with(_base, k_cache=_f32(2, 32, 2, 8), v_cache=_f32(2, 32, 2, 8)),
        ValueError,
        ["k_cache:", "headdim 8", "16"],
    ),
    (
        "nheads not a multiple",
        _with(_base, k_cache=_f32(2, 32, 3, 16), v_cache=_f32(2, 32, 3, 16)),
        ValueError,
        ["q:", "nheads 4", "nheads_k 3"],
    ),
    ("headdim 12", _with(_base, q=_f32(2, 1, 4, 12)), ValueError, ["headdim"]),
    ("seqlen_q 0", _with(_base, q=_f32(2, 0, 4, 16)), ValueError, ["q:", "seqlen_q"]),
    (
        "batch_cache < batch",
        _with(_base, q=_f32(3, 1, 4, 16), k=None, v=None, cache_seqlens=4),
        ValueError,
        ["k_cache:", "batch_cache 2", "batch 3"],
    ),
    ("k without v", _with(_base, v=None), ValueError, ["v:", "with k"]),
    ("v without k", _with(_base, k=None), ValueError, ["k:", "with v"]),
    ("k shape", _with(_base, k=_f32(2, 1, 4, 16), v=_f32(2, 1, 4, 16)), ValueError, ["k:"]),
    (
        "v shape",
        _with(_base, v=_f32(2, 2, 2, 16)),
        ValueError,
        ["v:", "like k"],
    ),
    (
        "k dtype",
        _with(_base, k=lambda a: a["k"].astype(np.float16)),
        TypeError,
        ["k:", "float16"],
    ),
    (
        "seqlen_new past capacity",
        _with(_base, k=_f32(2, 33, 2, 16), v=_f32(2, 33, 2, 16)),
        ValueError,
        ["k:", "seqlen_new 33"],
    ),
    ("k without cache_seqlens", _with(_base, cache_seqlens=None), ValueError, ["cache_seqlens:"]),
    (
        "cache_seqlens int64",
        _with(_base, cache_seqlens=np.array([1, 2])),
        TypeError,
        ["cache_seqlens:", "int32", "int64"],
    ),
    (
        "cache_seqlens shape",
        _with(_base, cache_seqlens=np.array([1, 2, 3], np.int32)),
        ValueError,
        ["cache_seqlens:", "expected shape (2) (batch,)"],
    ),
    ("cache_seqlens float", _with(_base, cache_seqlens=3.0), TypeError, ["cache_seqlens:", "3.0"]),
    ("cache_seqlens bool", _with(_base, cache_seqlens=True), TypeError, ["cache_seqlens:"]),
    ("cache_seqlens -1", _with(_base, cache_seqlens=-1), ValueError, ["cache_seqlens:", "-1"]),
    (
        "cache_seqlens int full",
        _with(_base, cache_seqlens=32),
        ValueError,
        ["cache_seqlens:", "32"],
    ),
    (
        "cache_seqlens value past capacity",
        _with(_base, cache_seqlens=np.array([3, 32], np.int32)),
        ValueError,
        ["cache_seqlens:", "cache_seqlens[1] = 32", "[0, 31]"],
    ),
    (
        "cache_seqlens negative value",
        _with(_base, cache_seqlens=np.array([-2, 3], np.int32)),
        ValueError,
        ["cache_seqlens[0] = -2"],
    ),
    (
        "cache_leftpad past cache_seqlens",
        _with(_base, cache_leftpad=np.array([0, 6], np.int32)),
        ValueError,
        ["cache_leftpad:", "cache_leftpad[1] = 6", "5"],
    ),
    (
        "cache_leftpad int64",
        _with(_base, cache_leftpad=np.array([0, 1])),
        TypeError,
        ["cache_leftpad:", "int32"],
    ),
    (
        "cache_batch_idx out of range",
        _with(_base, cache_batch_idx=np.array([0, 2], np.int32)),
        ValueError,
        ["cache_batch_idx:", "cache_batch_idx[1] = 2", "[0, 2)"],
    ),
    (
        "cache_batch_idx duplicate while appending",
        _with(_base, cache_batch_idx=np.array([1, 1], np.int32)),
        ValueError,
        ["cache_batch_idx:", "twice"],
    ),
    (
        "cache_batch_idx float",
        _with(_base, cache_batch_idx=np.array([0.0, 1.0])),
        TypeError,
        ["cache_batch_idx:", "int32"],
    ),
    (
        "cache_batch_idx with block_table",
        _with(_paged, cache_batch_idx=np.array([0, 1], np.int32)),
        ValueError,
        ["cache_batch_idx:", "block_table"],
    ),
    (
        "block_table int64",
        _with(_paged, block_table=lambda a: a["block_table"].astype(np.int64)),
        TypeError,
        ["block_table:", "int32"],
    ),
    (
        "block_table 1-D",
        _with(_paged, block_table=lambda a: a["block_table"][0]),
        ValueError,
        ["block_table:", "2-D"],
    ),
    (
        "block_table batch",
        _with(_paged, block_table=lambda a: a["block_table"][:1]),
        ValueError,
        ["block_table:", "batch=2"],
    ),
    (
        "block id out of range",
        _with(
            _paged,
            block_table=lambda a: np.where(
                a["block_table"] == a["block_table"][0, 0], 7, a["block_table"]
            ).astype(np.int32),
        ),
        ValueError,
        ["block_table:", "block_table[0, 0] = 7", "[0, 7)"],
    ),
    (
        "block id negative",
        _with(_paged, block_table=np.array([[0, 1], [-1, 2]], np.int32)),
        ValueError,
        ["block_table[1, 0] = -1"],
    ),
    (
        "shared block while appending",
        _with(
            _paged,
            block_table=np.array([[0, 1], [0, 2]], np.int32),
            cache_seqlens=np.array([3, 3], np.int32),
        ),
        ValueError,
        ["block_table:", "same cache slots"],
    ),
    (
        "block_size 24",
        _with(_paged, k_cache=_f32(7, 24, 2, 16), v_cache=_f32(7, 24, 2, 16)),
        ValueError,
        ["k_cache:", "block_size 24", "multiple of 16"],
    ),
    ("rotary_cos without sin", _with(_base, rotary_cos=_rot()), ValueError, ["rotary_sin:"]),
    ("rotary_sin without cos", _with(_base, rotary_sin=_rot()), ValueError, ["rotary_cos:"]),
    (
        "rotary_dim > headdim",
        _with(_base, rotary_cos=_rot(half=9), rotary_sin=_rot(half=9)),
        ValueError,
        ["rotary_cos:", "rotary_dim 18", "headdim=16"],
    ),
    (
        "rotary seqlen_ro < capacity",
        _with(_base, rotary_cos=_rot(31), rotary_sin=_rot(31)),
        ValueError,
        ["rotary_cos:", "seqlen_ro 31", "capacity 32"],
    ),
    (
        "rotary dtype",
        _with(_base, rotary_cos=_rot(dtype=np.float16), rotary_sin=_rot(dtype=np.float16)),
        TypeError,
        ["rotary_cos:", "float16"],
    ),
    (
        "rotary_sin dtype",
        _with(_base, rotary_cos=_rot(), rotary_sin=_rot(dtype=np.float64)),
        TypeError,
        ["rotary_sin:", "float64"],
    ),
    (
        "rotary_sin shape",
        _with(_base, rotary_cos=_rot(), rotary_sin=_rot(half=2)),
        ValueError,
        ["rotary_sin:", "like rotary_cos"],
    ),
    (
        "rotary position past the table",
        _with(
            _base,
            q=_f32(2, 3, 4, 16),
            k=None,
            v=None,
            cache_seqlens=np.array([3, 31], np.int32),
            rotary_cos=_rot(32),
            rotary_sin=_rot(32),
        ),
        ValueError,
        ["rotary_cos:", "seqlen_ro 32", "position 33"],
    ),
    ("out shape", _with(_base, out=_f32(2, 1, 4, 8)), ValueError, ["out:", "shape"]),
    ("out dtype", _with(_base, out=np.empty((2, 1, 4, 16), np.float16)), TypeError, ["out:"]),
    ("read-only k_cache", _with(_base, k_cache=_readonly), ValueError, ["k_cache:", "read-only"]),
    (
        "k_cache last dim strided",
        _with(_base, k_cache=lambda a: np.repeat(a["k_cache"], 2, axis=3)[..., ::2]),
        ValueError,
        ["k_cache:", "last dimension"],
    ),
]

OPTION_BAD: list[tuple[str, dict[str, Any], type, list[str]]] = [
    ("causal", {"causal": "yes"}, TypeError, ["causal:"]),
    ("return_lse", {"return_lse": 2}, TypeError, ["return_lse:"]),
    ("rotary_interleaved", {"rotary_interleaved": "x"}, TypeError, ["rotary_interleaved:"]),
    ("window", {"window_size": (-2, 0)}, ValueError, ["window_size:", "-2"]),
    ("window type", {"window_size": 3}, TypeError, ["window_size:"]),
    ("softcap", {"softcap": -1.0}, ValueError, ["softcap:", "-1.0"]),
    ("softmax_scale", {"softmax_scale": "a"}, TypeError, ["softmax_scale:"]),
    ("softmax_scale inf", {"softmax_scale": math.inf}, ValueError, ["softmax_scale:"]),
    ("num_splits negative", {"num_splits": -1}, ValueError, ["num_splits:", "-1"]),
    ("num_splits bool", {"num_splits": True}, TypeError, ["num_splits:"]),
    ("num_splits float", {"num_splits": 1.5}, TypeError, ["num_splits:", "1.5"]),
]


@pytest.mark.parametrize(("name", "make", "exc", "words"), BAD, ids=[c[0] for c in BAD])
def test_bad_input(
    name: str, make: Callable[[], dict[str, Any]], exc: type, words: list[str]
) -> None:
    a = make()
    with pytest.raises(exc) as info:
        flashscan.flash_attn_with_kvcache(**a)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{name}: {w!r} not in {msg!r}"


@pytest.mark.parametrize(
    ("name", "opts", "exc", "words"), OPTION_BAD, ids=[c[0] for c in OPTION_BAD]
)
def test_bad_option(name: str, opts: dict[str, Any], exc: type, words: list[str]) -> None:
    with pytest.raises(exc) as info:
        flashscan.flash_attn_with_kvcache(**_base(), **opts)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{name}: {w!r} not in {msg!r}"


def test_headdim_over_256_is_unsupported() -> None:
    a = _with(_base, q=_f32(2, 1, 4, 264), k_cache=_f32(2, 32, 2, 264))()
    a["v_cache"], a["k"], a["v"] = _f32(2, 32, 2, 264), _f32(2, 1, 2, 264), _f32(2, 1, 2, 264)
    with pytest.raises(flashscan.UnsupportedError, match="q: headdim 264"):
        flashscan.flash_attn_with_kvcache(**a)


# ---------------------------------------------------------------------------------------------
# CUDA dispatch: a NumPy array pretending to be on cuda:<dev>, a fake native module
# ---------------------------------------------------------------------------------------------


class FakeCuda:
    def __init__(self, a: np.ndarray, dev: int = 0) -> None:
        self.a, self.dev = a, dev

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.dev)

    def __dlpack__(self, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise BufferError("fake")

    def __add__(self, n: int) -> FakeCuda:  # cache_seqlens + seqlen_new, as torch does it
        return FakeCuda((self.a + n).astype(self.a.dtype), self.dev)


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


def _un(x: Any) -> Any:
    return None if x is None else x.a


class FakeNative:
    """The two decode entries of the contract, computed with the reference's pieces."""

    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse = refuse  # a dtype this core raises UnsupportedError for

    def kvcache_append(
        self,
        k,
        v,
        k_cache,
        v_cache,
        seqlens,
        bidx,
        pad,
        bt,
        cos,
        sin,
        interleaved,
        q,
        q_rot,
        stream,
    ) -> None:  # noqa: ANN001
        if self.refuse and k_cache.a.dtype.name == self.refuse:
            raise flashscan.UnsupportedError(f"kvcache_append: {self.refuse} is not served")
        self.calls.append(
            (
                "kvcache_append",
                {
                    "stream": stream,
                    "seqlens": seqlens.a.copy(),
                    "k": k is not None,
                    "q": q is not None,
                    "interleaved": interleaved,
                },
            )
        )
        lens, b = seqlens.a.astype(np.int64), seqlens.a.shape[0]
        lp = np.zeros(b, np.int64) if pad is None else pad.a.astype(np.int64)
        bs = k_cache.a.shape[1]
        for bi in range(b):
            if k is not None:
                pos = lens[bi] + np.arange(k.a.shape[1])
                kb = k.a[bi].astype(F64)
                if cos is not None:
                    kb = reference_kvcache.apply_rotary(kb, cos.a, sin.a, pos - lp[bi], interleaved)
                if bt is not None:
                    r, s = bt.a[bi, pos // bs], pos % bs
                else:
                    r, s = (bi if bidx is None else bidx.a[bi]), pos
                k_cache.a[r, s] = kb
                v_cache.a[r, s] = v.a[bi]
            if q is not None:
                pos = lens[bi] - lp[bi] + np.arange(q.a.shape[1])
                q_rot.a[bi] = reference_kvcache.apply_rotary(
                    q.a[bi], cos.a, sin.a, pos, interleaved
                )

    def flash_attn_kvcache(
        self,
        q,
        k_cache,
        v_cache,
        out,
        lse,
        seqlens_k,
        bidx,
        pad,
        bt,
        scale,
        wl,
        wr,
        cap,
        splits,
        stream,
        seqlens_k_add=0,
    ) -> None:  # noqa: ANN001
        if self.refuse and q.a.dtype.name == self.refuse:
            raise flashscan.UnsupportedError(f"flash_attn_kvcache: {self.refuse} is not served")
        self.calls.append(
            (
                "flash_attn_kvcache",
                {
                    "stream": stream,
                    "seqlens_k": seqlens_k.a.copy(),
                    "seqlens_k_add": seqlens_k_add,
                    "options": (scale, wl, wr, cap, splits),
                    "lse": lse is not None,
                },
            )
        )
        o, l_ = reference_kvcache.flash_attn_with_kvcache(
            q.a,
            k_cache.a,
            v_cache.a,
            cache_seqlens=seqlens_k.a + seqlens_k_add,
            cache_batch_idx=_un(bidx),
            cache_leftpad=_un(pad),
            block_table=_un(bt),
            softmax_scale=scale,
            window_size=(wl, wr),
            softcap=cap,
            return_lse=True,
        )
        out.a[...] = o
        if lse is not None:
            lse.a[...] = l_


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(_frameworks._HANDLERS, FakeCuda, FakeCudaHandler())
    monkeypatch.setattr(_backend, "_policy", None)
    monkeypatch.setattr(_backend, "_warned", False)
    monkeypatch.setattr(kvcache, "_FP32_REFUSED", None)
    monkeypatch.delenv("FLASHSCAN_CHECK_INDICES", raising=False)
    monkeypatch.setenv("FLASHSCAN_FALLBACK", "warn")
    return FakeCuda


@pytest.fixture
def fake_native(fake_cuda: Any, monkeypatch: pytest.MonkeyPatch) -> FakeNative:
    nat = FakeNative()
    monkeypatch.setattr(kvcache, "_native", nat)
    monkeypatch.setattr(_backend, "_usable", frozenset({0}))
    return nat


def on_gpu(a: dict[str, Any], dev: int = 0) -> dict[str, Any]:
    return {k: (FakeCuda(v, dev) if isinstance(v, np.ndarray) else v) for k, v in a.items()}


def check_gpu_call(a: dict[str, Any], opts: dict[str, Any], tol: float = 1e-5) -> dict[str, Any]:
    """Call with the arrays on the fake GPU; compare against the naive loop, caches included."""
    g = on_gpu(a)
    ref_out, ref_lse, ref_kc, ref_vc = naive_kvcache(**copied(a), **opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = flashscan.flash_attn_with_kvcache(**g, **opts, return_lse=True)
    g["warnings"] = [str(w.message) for w in caught if w.category is flashscan.FallbackWarning]
    assert isinstance(out, FakeCuda) and isinstance(lse, FakeCuda)
    np.testing.assert_allclose(out.a, ref_out, rtol=0, atol=tol)
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse.a[fin], ref_lse[fin], rtol=1e-6)
    assert np.array_equal(np.isneginf(lse.a), ~fin)
    np.testing.assert_allclose(g["k_cache"].a, ref_kc, rtol=0, atol=tol)
    np.testing.assert_array_equal(g["v_cache"].a, ref_vc)
    return g


def test_dispatch_append_rotary_paged(fake_native: FakeNative, rng: np.random.Generator) -> None:
    a = make_case(
        rng,
        batch=3,
        seqlen_q=2,
        seqlen_new=2,
        block_size=16,
        capacity=48,
        rotary_dim=8,
        dtype=np.float32,
    )
    check_gpu_call(
        a, {"causal": True, "rotary_interleaved": False, "num_splits": 4, "softcap": 3.0}
    )
    (n1, c1), (n2, c2) = fake_native.calls
    assert (n1, n2) == ("kvcache_append", "flash_attn_kvcache")
    assert c1["stream"] == c2["stream"] == 1000 and c1["k"] and c1["q"] and not c1["interleaved"]
    np.testing.assert_array_equal(c1["seqlens"], a["cache_seqlens"])
    # the attention sees the keys after the append: cache_seqlens + 2, added by the kernel
    np.testing.assert_array_equal(c2["seqlens_k"], a["cache_seqlens"])
    assert c2["seqlens_k_add"] == 2 and c2["seqlens_k"].dtype == np.int32
    assert c2["options"] == (0.25, -1, 0, 3.0, 4) and c2["lse"]


def test_dispatch_int_lengths_leftpad_batch_idx(
    fake_native: FakeNative, rng: np.random.Generator
) -> None:
    a = make_case(
        rng, batch=3, seqlen_q=1, seqlen_new=1, leftpad=True, batch_idx=True, dtype=np.float32
    )
    a["cache_seqlens"] = 6
    a["cache_leftpad"] = np.array([0, 2, 6], np.int32)
    check_gpu_call(a, {"window_size": (3, 0)})
    (_, c1), (_, c2) = fake_native.calls
    assert not c1["q"]  # no rotary: q is not copied
    assert c1["seqlens"].tolist() == [6, 6, 6] and c2["seqlens_k"].tolist() == [6, 6, 6]
    assert c2["seqlens_k_add"] == 1


def test_dispatch_no_append_no_rotary(fake_native: FakeNative, rng: np.random.Generator) -> None:
    a = make_case(rng, batch=2, seqlen_q=3, seqlen_new=0, dtype=np.float32)
    check_gpu_call(a, {"causal": True})
    assert [c[0] for c in fake_native.calls] == ["flash_attn_kvcache"]


def test_dispatch_without_lse_allocates_none(
    fake_native: FakeNative, rng: np.random.Generator
) -> None:
    a = make_case(rng, batch=2, seqlen_q=1, seqlen_new=1, dtype=np.float32)
    g = on_gpu(a)
    ref_out = naive_kvcache(**copied(a))[0]
    out = flashscan.flash_attn_with_kvcache(**g)
    assert isinstance(out, FakeCuda)
    np.testing.assert_allclose(out.a, ref_out, rtol=0, atol=1e-5)
    (_, c1), (_, c2) = fake_native.calls
    assert not c2["lse"]  # the kernels were asked for no LSE


def test_dispatch_rotary_without_new_keys(
    fake_native: FakeNative, rng: np.random.Generator
) -> None:
    a = make_case(rng, batch=2, seqlen_q=2, seqlen_new=0, rotary_dim=16, dtype=np.float32)
    check_gpu_call(a, {})
    (_, c1), _ = fake_native.calls
    assert c1["q"] and not c1["k"]


def test_dispatch_out_and_devices(fake_native: FakeNative, rng: np.random.Generator) -> None:
    a = make_case(rng, batch=2, dtype=np.float32)
    g = on_gpu(a)
    out = FakeCuda(np.full(a["q"].shape, np.nan, np.float32))
    assert flashscan.flash_attn_with_kvcache(**g, out=out) is out
    assert not np.isnan(out.a).any()
    g = on_gpu(make_case(rng, batch=2, dtype=np.float32))
    g["block_table"] = np.zeros((2, 1), np.int32)
    with pytest.raises(ValueError, match="block_table: is on cpu but q is on cuda:0"):
        flashscan.flash_attn_with_kvcache(**g)
    g = on_gpu(make_case(rng, batch=2, dtype=np.float32))
    g["cache_seqlens"] = FakeCuda(g["cache_seqlens"].a, 1)
    with pytest.raises(ValueError, match="cache_seqlens: is on cuda:1 but q is on cuda:0"):
        flashscan.flash_attn_with_kvcache(**g)


def test_dispatch_does_not_read_indices_unless_asked(
    fake_native: FakeNative, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """On the GPU the index values are the kernels' to clamp (no host sync); with
    FLASHSCAN_CHECK_INDICES=1 they are read and checked before any launch."""
    a = make_case(rng, batch=2, block_size=16, capacity=32, dtype=np.float32)
    a["block_table"][1, 0] = 99
    calls: list[str] = []
    monkeypatch.setattr(FakeNative, "kvcache_append", lambda self, *x: calls.append("append"))
    monkeypatch.setattr(FakeNative, "flash_attn_kvcache", lambda self, *x: calls.append("attn"))
    flashscan.flash_attn_with_kvcache(**on_gpu(a))
    assert calls == ["append", "attn"]
    monkeypatch.setenv("FLASHSCAN_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = 99"):
        flashscan.flash_attn_with_kvcache(**on_gpu(a))
    assert calls == ["append", "attn"]


@pytest.mark.parametrize("policy", ["warn", "silent", "error"])
def test_fallback_unusable_device(
    policy: str, fake_cuda: Any, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """No usable device: the policy, then the reference on host copies, the caches written
    back into the caller's (GPU) arrays."""
    monkeypatch.setattr(_backend, "_usable", frozenset())
    monkeypatch.setenv("FLASHSCAN_FALLBACK", policy)
    a = make_case(
        rng,
        batch=3,
        seqlen_q=2,
        seqlen_new=2,
        block_size=16,
        capacity=32,
        rotary_dim=8,
        dtype=np.float32,
    )
    if policy == "error":
        g = on_gpu(a)
        before = g["k_cache"].a.copy()
        with pytest.raises(flashscan.FlashscanError, match="FLASHSCAN_FALLBACK=error"):
            flashscan.flash_attn_with_kvcache(**g)
        np.testing.assert_array_equal(g["k_cache"].a, before)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = on_gpu(a)
        ref_out, _, ref_kc, ref_vc = naive_kvcache(**copied(a), causal=True)
        out = flashscan.flash_attn_with_kvcache(**g, causal=True)
    fw = [w for w in caught if issubclass(w.category, flashscan.FallbackWarning)]
    assert len(fw) == (1 if policy == "warn" else 0)
    if fw:
        assert fw[0].filename == __file__ and "flash_attn_with_kvcache" in str(fw[0].message)
    assert isinstance(out, FakeCuda)
    np.testing.assert_allclose(out.a, ref_out, rtol=0, atol=1e-5)
    np.testing.assert_allclose(g["k_cache"].a, ref_kc, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(g["v_cache"].a, ref_vc)


def test_fallback_native_without_decode_entries(
    fake_cuda: Any, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """A native module that predates the decode kernels: the host path, with a warning that
    says so."""
    monkeypatch.setattr(kvcache, "_native", object())
    monkeypatch.setattr(_backend, "_usable", frozenset({0}))
    a = make_case(rng, batch=2, seqlen_new=1, rotary_dim=8, leftpad=True, dtype=np.float32)
    g = check_gpu_call(a, {"causal": True})
    assert len(g["warnings"]) == 1 and "no flash_attn_kvcache kernel" in g["warnings"][0]


def test_float32_refused_by_the_native_core(
    fake_native: FakeNative, rng: np.random.Generator
) -> None:
    """The native core raises UnsupportedError for float32: the host path with the fallback
    warning, and later float32 calls do not ask the native core again; other dtypes still run
    natively, and their UnsupportedError is not swallowed."""
    fake_native.refuse = "float32"
    a = make_case(rng, batch=2, seqlen_q=2, seqlen_new=2, rotary_dim=8, dtype=np.float32)
    g = check_gpu_call(copied(a), {"causal": True})
    assert len(g["warnings"]) == 1 and "does not serve float32" in g["warnings"][0]
    check_gpu_call(a, {"causal": True})
    assert fake_native.calls == []
    assert kvcache._FP32_REFUSED is not None
    b = make_case(rng, batch=2, dtype=np.float16)
    check_gpu_call(b, {}, tol=2e-3)
    assert [c[0] for c in fake_native.calls] == ["kvcache_append", "flash_attn_kvcache"]
    fake_native.refuse = "float16"
    with pytest.raises(flashscan.UnsupportedError, match="float16 is not served"):
        flashscan.flash_attn_with_kvcache(**on_gpu(make_case(rng, dtype=np.float16)))


def test_immutable_caches_cannot_take_new_keys(
    fake_native: FakeNative, rng: np.random.Generator
) -> None:
    a = make_case(rng, batch=2, dtype=np.float32)
    g = on_gpu(a)
    g["k_cache"].a.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache: the array is read-only"):
        flashscan.flash_attn_with_kvcache(**g)
    assert not fake_native.calls


# ---------------------------------------------------------------------------------------------
# Layers: the new core modules never reach the torch adapter
# ---------------------------------------------------------------------------------------------


def test_kvcache_core_never_reaches_the_torch_adapter() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import test_layers
    finally:
        sys.path.pop(0)
    graph = test_layers.import_graph()
    for mod in ("flashscan.kvcache", "flashscan.reference_kvcache"):
        reached = test_layers.reachable(graph, mod)
        assert "flashscan.torch" not in reached and "flashscan" not in reached, mod
    assert test_layers.find_cycle(graph) is None
