"""`flash_attn_varlen_func` on the CPU: the NumPy references (forward and backward) against
naive float64 attention per sequence (ragged lengths incl. 0 and 1, GQA, causal with query and
key lengths differing per sequence, windows, softcap), the API's host path, the checks of bad
input, and the torch adapter (gradcheck through the references, opcheck of the custom ops,
routing of grad-requiring calls)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import reference_varlen

# (causal, window_size, softcap)
MASKS = {
    "none": (False, (-1, -1), 0.0),
    "causal": (True, (-1, -1), 0.0),
    "window": (False, (3, 2), 0.0),
    "causal-window": (True, (4, -1), 0.0),
    "softcap": (False, (-1, -1), 2.0),
    "causal-softcap": (True, (-1, -1), 1.5),
}
# (lengths of q, lengths of k): zero-length queries and keys, single rows, sq != sk both ways
LENGTHS = {
    "ragged": ([5, 0, 1, 9, 3], [7, 4, 0, 9, 1]),
    "ones": ([1, 1, 1], [1, 6, 2]),
    "one-seq": ([12], [17]),
    "decode-like": ([1, 2], [30, 11]),
}


def cu(lens: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def naive(q, k, v, scale, causal, window, cap):  # type: ignore[no-untyped-def]
    """float64 attention of one sequence, (sq, h, d) x (sk, hk, d): explicit mask loops."""
    sq, h, d = q.shape
    sk, hk, _ = k.shape
    group = h // hk
    out = np.zeros((sq, h, d))
    lse = np.full((h, sq), -np.inf)
    left, right = window
    if causal:
        right = 0
    for hh in range(h):
        kk, vv = k[:, hh // group].astype(np.float64), v[:, hh // group].astype(np.float64)
        for i in range(sq):
            s = kk @ q[i, hh].astype(np.float64) * scale
            if cap > 0:
                s = cap * np.tanh(s / cap)
            pos = i + sk - sq
            vis = [
                (right < 0 or j <= pos + right) and (left < 0 or j >= pos - left) for j in range(sk)
            ]
            s = np.where(vis, s, -np.inf)
            if not np.isfinite(s).any():
                continue
            m = s.max()
            p = np.exp(s - m)
            out[i, hh] = p @ vv / p.sum()
            lse[hh, i] = m + math.log(p.sum())
    return out, lse


def make(lq: list[int], lk: list[int], h: int, hk: int, d: int, rng: Any) -> tuple[Any, ...]:
    tq, tk = sum(lq), sum(lk)
    q = rng.standard_normal((tq, h, d))
    k = rng.standard_normal((tk, hk, d))
    v = rng.standard_normal((tk, hk, d))
    return q, k, v, cu(lq), cu(lk)


def f32(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(x.astype(np.float32) if x.dtype == np.float64 else x for x in args)


@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_reference_matches_naive_per_sequence(
    lengths: str, mask: str, heads: tuple[int, int], rng: Any
) -> None:
    lq, lk = LENGTHS[lengths]
    causal, window, cap = MASKS[mask]
    h, hk = heads
    q, k, v, cq, ck = make(lq, lk, h, hk, 8, rng)
    o, lse = reference_varlen.flash_attn_varlen_func(
        q, k, v, cq, ck, 0.3, causal, window, cap, True, accum_dtype=np.dtype(np.float64)
    )
    assert o.shape == q.shape and lse.shape == (h, q.shape[0])
    for b in range(len(lq)):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        no, nl = naive(q[q0:q1], k[k0:k1], v[k0:k1], 0.3, causal, window, cap)
        np.testing.assert_allclose(o[q0:q1], no, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse[:, q0:q1], nl, rtol=1e-6, atol=1e-6)  # lse is float32


def _torch_naive_grads(q, k, v, cq, ck, dout, scale, causal, window, cap):  # type: ignore[no-untyped-def]
    """float64 torch autograd of per-sequence math attention (independent of the reference)."""
    torch = pytest.importorskip("torch")
    leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    tq, tk, tv = leaves
    h, hk = q.shape[1], k.shape[1]
    outs = []
    for b in range(len(cq) - 1):
        qs, ks, vs = tq[cq[b] : cq[b + 1]], tk[ck[b] : ck[b + 1]], tv[ck[b] : ck[b + 1]]
        sq, sk = qs.shape[0], ks.shape[0]
        ks, vs = ks.repeat_interleave(h // hk, 1), vs.repeat_interleave(h // hk, 1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        left, right = window
        if causal:
            right = 0
        i = torch.arange(sq)[:, None] + (sk - sq)
        j = torch.arange(sk)[None, :]
        vis = torch.ones(sq, sk, dtype=torch.bool)
        if right >= 0:
            vis &= j <= i + right
        if left >= 0:
            vis &= j >= i - left
        s = s.masked_fill(~vis, float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vs))
    out = torch.cat(outs)
    grads = torch.autograd.grad(out, leaves, torch.tensor(dout), allow_unused=True)
    return [np.zeros(x.shape) if g is None else g.numpy() for g, x in zip(grads, (q, k, v))]


@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("mask", list(MASKS))
def test_reference_backward_matches_torch_autograd(lengths: str, mask: str, rng: Any) -> None:
    pytest.importorskip("torch")
    lq, lk = LENGTHS[lengths]
    causal, window, cap = MASKS[mask]
    q, k, v, cq, ck = make(lq, lk, 4, 2, 8, rng)
    f64 = np.dtype(np.float64)
    o, lse = reference_varlen.flash_attn_varlen_func(
        q, k, v, cq, ck, 0.3, causal, window, cap, True, accum_dtype=f64
    )
    dout = rng.standard_normal(o.shape)
    got = reference_varlen.flash_attn_varlen_bwd(
        dout, q, k, v, o, lse, cq, ck, 0.3, causal, window, cap, accum_dtype=f64
    )
    want = _torch_naive_grads(q, k, v, cq, ck, dout, 0.3, causal, window, cap)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-7, atol=1e-9, err_msg=name)


def test_api_host_path_and_out(rng: Any) -> None:
    lq, lk = LENGTHS["ragged"]
    q, k, v, cq, ck = f32(make(lq, lk, 4, 2, 16, rng))
    out = np.full_like(q, np.nan)
    res, lse = flashscan.flash_attn_varlen_func(
        q, k, v, cq, ck, max(lq), max(lk), causal=True, return_lse=True, out=out
    )
    assert res is out and lse.shape == (4, q.shape[0]) and lse.dtype == np.float32
    assert not np.isnan(out).any()
    ref = reference_varlen.flash_attn_varlen_func(q, k, v, cq, ck, 0.25, True)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    # a sequence with no keys: output 0, lse -inf
    b = 2  # lk[2] == 0, lq[2] == 1
    assert np.all(out[cq[b] : cq[b + 1]] == 0) and np.all(np.isneginf(lse[:, cq[b]]))


def test_empty_batch_and_empty_totals(rng: Any) -> None:
    q, k, v, cq, ck = f32(make([0, 0], [3, 0], 2, 2, 8, rng))
    o = flashscan.flash_attn_varlen_func(q, k, v, cq, ck, 0, 3)
    assert o.shape == (0, 2, 8)
    q, k, v, cq, ck = f32(make([], [], 2, 2, 8, rng))
    o, lse = flashscan.flash_attn_varlen_func(q, k, v, cq, ck, 0, 0, return_lse=True)
    assert o.shape == (0, 2, 8) and lse.shape == (2, 0)


_F32_5x3 = np.zeros((5, 3, 8), np.float32)


def _bad(**over: Any) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    q, k, v, cq, ck = make([3, 2], [4, 1], 4, 2, 8, rng)
    args = dict(
        q=q.astype(np.float32),
        k=k.astype(np.float32),
        v=v.astype(np.float32),
        cu_seqlens_q=cq,
        cu_seqlens_k=ck,
        max_seqlen_q=3,
        max_seqlen_k=4,
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, exc, text",
    [
        (dict(cu_seqlens_q=np.array([0, 3, 2], np.int32)), ValueError, "non-decreasing"),
        (dict(cu_seqlens_q=np.array([0, 1, 4], np.int32)), ValueError, "packed length 5"),
        (dict(cu_seqlens_k=np.array([1, 4, 5], np.int32)), ValueError, "start at 0"),
        (dict(max_seqlen_q=2), ValueError, "max_seqlen_q = 2"),
        (dict(max_seqlen_k=3), ValueError, "max_seqlen_k = 3"),
        (dict(cu_seqlens_q=np.array([0, 3, 5], np.int64)), TypeError, "int32"),
        (
            dict(cu_seqlens_k=np.array([0, 5], np.int32)),
            ValueError,
            "2 entries but cu_seqlens_q has 3",
        ),
        (dict(cu_seqlens_q=np.zeros((0,), np.int32)), ValueError, ">= 1 entries"),
        (dict(cu_seqlens_q=np.array([[0, 3, 5]], np.int32)), ValueError, "1-D"),
        (dict(q=np.zeros((1, 5, 4, 8), np.float32)), ValueError, "3-D"),
        (dict(k=_F32_5x3, v=_F32_5x3), ValueError, "multiple"),
        (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q"),
        (dict(max_seqlen_k=2.5), TypeError, "max_seqlen_k"),
        (dict(v=np.zeros((5, 2, 8), np.float16)), TypeError, "dtype"),
    ],
)
def test_bad_inputs_raise(over: dict[str, Any], exc: type, text: str) -> None:
    with pytest.raises(exc, match=text):
        flashscan.flash_attn_varlen_func(**_bad(**over))


def test_bad_out_raises() -> None:
    args = _bad()
    with pytest.raises(ValueError, match="out"):
        flashscan.flash_attn_varlen_func(**args, out=np.zeros((5, 4, 16), np.float32))


# ---------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------


def _torch_case(dtype: Any, lq: list[int], lk: list[int], h: int = 4, hk: int = 2, d: int = 8):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    q = torch.randn(sum(lq), h, d, generator=g, dtype=dtype)
    k = torch.randn(sum(lk), hk, d, generator=g, dtype=dtype)
    v = torch.randn(sum(lk), hk, d, generator=g, dtype=dtype)
    return q, k, v, torch.tensor(cu(lq)), torch.tensor(cu(lk))


@pytest.mark.parametrize("mask", ["causal", "window", "causal-softcap"])
def test_torch_gradcheck_float64(mask: str) -> None:
    torch = pytest.importorskip("torch")
    import flashscan.torch as fst

    causal, window, cap = MASKS[mask]
    lq, lk = [3, 0, 1, 4], [2, 3, 0, 5]
    q, k, v, cq, ck = _torch_case(torch.float64, lq, lk)
    leaves = tuple(t.requires_grad_() for t in (q, k, v))

    def f(q: Any, k: Any, v: Any) -> Any:
        return fst.flash_attn_varlen_func(
            q, k, v, cq, ck, max(lq), max(lk), causal=causal, window_size=window, softcap=cap
        )

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_torch_float32_grads_match_float64() -> None:
    torch = pytest.importorskip("torch")
    lq, lk = [5, 1, 7], [6, 9, 7]
    q, k, v, cq, ck = _torch_case(torch.float32, lq, lk)
    grads = []
    for dt in (torch.float32, torch.float64):
        leaves = [t.to(dt).requires_grad_() for t in (q, k, v)]
        # the top-level API routes grad-requiring calls to the torch adapter
        out = flashscan.flash_attn_varlen_func(*leaves, cq, ck, 7, 9, causal=True)
        grads.append(torch.autograd.grad(out.sum(), leaves))
    for g32, g64 in zip(*grads):
        assert g32.dtype == torch.float32
        torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-5)


def test_torch_opcheck() -> None:
    torch = pytest.importorskip("torch")
    import flashscan.torch  # noqa: F401  (registers the ops)

    q, k, v, cq, ck = _torch_case(torch.float32, [3, 4], [5, 2])
    args = (q, k, v, cq, ck, 4, 5, 0.3, -1, 0, 0.0, False)
    torch.library.opcheck(torch.ops.flashscan.flash_attn_varlen_fwd.default, args)
    out, lse = torch.ops.flashscan.flash_attn_varlen_fwd(*args)
    assert lse.shape == (4, 7)
    bargs = (torch.randn_like(out), q, k, v, out, lse, cq, ck, 4, 5, 0.3, -1, 0, 0.0, False)
    torch.library.opcheck(torch.ops.flashscan.flash_attn_varlen_bwd.default, bargs)


def test_torch_out_with_grad_is_refused() -> None:
    torch = pytest.importorskip("torch")
    q, k, v, cq, ck = _torch_case(torch.float32, [3], [3])
    q.requires_grad_()
    with pytest.raises(ValueError, match="autograd"):
        flashscan.flash_attn_varlen_func(q, k, v, cq, ck, 3, 3, out=torch.empty_like(q))
