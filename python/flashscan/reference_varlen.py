"""NumPy references of `flash_attn_varlen_func` and its backward: packed sequences, each one
the dense attention of `reference.flash_attn_func` / `reference_bwd.flash_attn_bwd` on its own
rows.

q: (total_q, nheads, headdim), k, v: (total_k, nheads_k, headdim); sequence b owns rows
cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v, so
causal and window masks are aligned bottom-right per sequence (as flash-attn does when a
sequence's query and key lengths differ). lse is (nheads, total_q) as flash-attn's varlen
function returns it. Like the other references these check nothing beyond what the math needs
(the API validates cu_seqlens); rows no sequence owns stay 0.
"""

from __future__ import annotations

import numpy as np

from . import reference, reference_bwd

__all__ = ["flash_attn_varlen_bwd", "flash_attn_varlen_func"]

_Array = np.ndarray


def _bounds(cu: _Array) -> list[tuple[int, int]]:
    c = np.asarray(cu, dtype=np.int64).reshape(-1)
    return [(int(c[i]), int(c[i + 1])) for i in range(c.size - 1)]


def flash_attn_varlen_func(
    q: _Array,
    k: _Array,
    v: _Array,
    cu_seqlens_q: _Array,
    cu_seqlens_k: _Array,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    *,
    accum_dtype: np.dtype = np.float32,
) -> _Array | tuple[_Array, _Array]:
    """Attention over packed sequences; returns out like q and, with `return_lse`, lse
    (nheads, total_q) float32 (-inf for a query that sees no key)."""
    nheads = q.shape[1]
    out = np.zeros(q.shape, dtype=q.dtype)
    lse = np.full((nheads, q.shape[0]), -np.inf, dtype=np.float32)
    for (q0, q1), (k0, k1) in zip(_bounds(cu_seqlens_q), _bounds(cu_seqlens_k)):
        if q1 == q0:
            continue
        o, l_seq = reference.flash_attn_func(
            q[None, q0:q1],
            k[None, k0:k1],
            v[None, k0:k1],
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            return_lse=True,
            accum_dtype=accum_dtype,
        )
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l_seq[0]
    return (out, lse) if return_lse else out


def flash_attn_varlen_bwd(
    dout: _Array,
    q: _Array,
    k: _Array,
    v: _Array,
    out: _Array,
    lse: _Array,
    cu_seqlens_q: _Array,
    cu_seqlens_k: _Array,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    *,
    accum_dtype: np.dtype = np.float32,
) -> tuple[_Array, _Array, _Array]:
    """Gradients (dq, dk, dv) of `flash_attn_varlen_func`'s output, per sequence by
    `reference_bwd.flash_attn_bwd`; lse is the forward's (nheads, total_q)."""
    dq = np.zeros(q.shape, dtype=q.dtype)
    dk = np.zeros(k.shape, dtype=k.dtype)
    dv = np.zeros(v.shape, dtype=v.dtype)
    for (q0, q1), (k0, k1) in zip(_bounds(cu_seqlens_q), _bounds(cu_seqlens_k)):
        if k1 == k0 or q1 == q0:
            continue  # no key, or no query: every gradient of the sequence is 0
        gq, gk, gv = reference_bwd.flash_attn_bwd(
            dout[None, q0:q1],
            q[None, q0:q1],
            k[None, k0:k1],
            v[None, k0:k1],
            out[None, q0:q1],
            lse[None, :, q0:q1],
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            accum_dtype=accum_dtype,
        )
        dq[q0:q1] = gq[0]
        dk[k0:k1] = gk[0]
        dv[k0:k1] = gv[0]
    return dq, dk, dv
