"""NumPy reference implementations of flashscan's operations.

These compute the same functions as the CUDA kernels, on the host, and are what flashscan falls
back to where no usable GPU exists. They take NumPy arrays (float16, float32 or float64; the
caller converts bfloat16) and check nothing beyond what the math needs: the public API validates.

- `flash_attn_func`: flash-attn forward semantics, computed blockwise over key blocks with an
  online softmax, so memory stays O(seqlen * headdim) plus one block of scores.
- `selective_scan_fn`: mamba_ssm's selective scan, with `initial_state` for streaming.
- `selective_state_update`: mamba_ssm's single-step decode update, state updated in place.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["flash_attn_func", "selective_scan_fn", "selective_state_update"]

# Attention tiling: keys are processed in blocks of _BLOCK_K; queries in blocks of at most
# _BLOCK_Q_MAX rows, fewer when batch * nheads is large, so that one block of scores holds at
# most about _SCORE_BUDGET elements.
_BLOCK_K = 128
_BLOCK_Q_MAX = 256
_SCORE_BUDGET = 1 << 21

# Scan chunking: a chunk of T time steps is scanned at once with a log-depth (Hillis-Steele)
# combination of the linear recurrence, where T * batch * dim * dstate is about _SCAN_BUDGET.
_SCAN_BUDGET = 1 << 16

_Array = np.ndarray


def _compute_dtype(*arrays: _Array | None) -> np.dtype:
    """float64 if any array is float64, else float32."""
    if any(a is not None and a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _softplus(x: _Array) -> _Array:
    """log1p(exp(x)) for x <= 20, x above (as mamba)."""
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def _silu(x: _Array) -> _Array:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


def flash_attn_func(
    q: _Array,
    k: _Array,
    v: _Array,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    out: _Array | None = None,
    *,
    accum_dtype: np.dtype = np.float32,
    lse_dtype: np.dtype = np.float32,
) -> _Array | tuple[_Array, _Array]:
    """Attention forward with flash-attn's layout and semantics.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), with
    nheads % nheads_k == 0 (head h reads kv head h // (nheads // nheads_k)). Causal and window
    masks are aligned bottom-right: query i sees key j iff
    i + sk - sq - left <= j <= i + sk - sq + right (a negative bound is unbounded; causal sets
    right = 0). softcap > 0 caps the scaled scores as softcap * tanh(s / softcap).
    A query that sees no key gets output 0 and lse -inf.

    Accumulates in `accum_dtype` (float32 or float64). Returns out in q's dtype (written into
    `out` when given, which is returned), and with `return_lse` also lse
    (batch, nheads, seqlen_q) float32 (the API's contract), or `lse_dtype`: float64 keeps a
    float64 computation's lse exact enough to merge partial results (ring attention).
    """
    acc = np.dtype(accum_dtype)
    batch, sq, nheads, hd = q.shape
    sk, nheads_k = k.shape[1], k.shape[2]
    hd_v = v.shape[3]
    group = nheads // nheads_k if nheads_k else 1
    scale = softmax_scale if softmax_scale is not None else (1.0 / math.sqrt(hd) if hd else 1.0)

    left, right = (int(w) for w in window_size)
    if causal:
        right = 0
    left_b = left if left >= 0 else None
    right_b = right if right >= 0 else None
    offset = sk - sq  # bottom-right alignment: query i sits at key position i + offset

    # (batch, nheads_k, group, seqlen, headdim); the scale is folded into q (a fresh copy).
    qg = q.reshape(batch, sq, nheads_k, group, hd).transpose(0, 2, 3, 1, 4).astype(acc)
    qg *= acc.type(scale)
    kg = np.ascontiguousarray(k.transpose(0, 2, 1, 3), dtype=acc)[:, :, None]
    vg = np.ascontiguousarray(v.transpose(0, 2, 1, 3), dtype=acc)[:, :, None]

    result = out if out is not None else np.empty((batch, sq, nheads, hd_v), dtype=q.dtype)
    lse_all = np.empty((batch, nheads, sq), dtype=lse_dtype) if return_lse else None

    block_k = _BLOCK_K
    block_q = max(1, min(sq, _BLOCK_Q_MAX, _SCORE_BUDGET // max(1, batch * nheads * block_k)))
    cap = acc.type(softcap) if softcap > 0 else None

    for i0 in range(0, sq, block_q):
        i1 = min(i0 + block_q, sq)
        nq = i1 - i0
        qb = qg[:, :, :, i0:i1]
        m = np.full((batch, nheads_k, group, nq, 1), -np.inf, dtype=acc)
        denom = np.zeros((batch, nheads_k, group, nq, 1), dtype=acc)
        acc_o = np.zeros((batch, nheads_k, group, nq, hd_v), dtype=acc)

        # Keys any row of this query block may see; blocks outside are skipped.
        j_lo = 0 if left_b is None else max(0, i0 + offset - left_b)
        j_hi = sk if right_b is None else min(sk, i1 - 1 + offset + right_b + 1)
        for j0 in range(j_lo, j_hi, block_k):
            j1 = min(j0 + block_k, j_hi)
            s = qb @ kg[:, :, :, j0:j1].swapaxes(-1, -2)  # (batch, nheads_k, group, nq, nk)
            if cap is not None:
                s /= cap
                np.tanh(s, out=s)
                s *= cap
            full = (right_b is None or j1 - 1 <= i0 + offset + right_b) and (
                left_b is None or j0 >= i1 - 1 + offset - left_b
            )
            if not full:
                pos = np.arange(i0, i1)[:, None] + offset
                key = np.arange(j0, j1)[None, :]
                visible = np.ones((nq, j1 - j0), dtype=bool)
                if right_b is not None:
                    visible &= key <= pos + right_b
                if left_b is not None:
                    visible &= key >= pos - left_b
                s += np.where(visible, acc.type(0), acc.type(-np.inf))

            # Online softmax: rows with no visible key so far keep m = -inf and use 0 as base.
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            base = np.where(np.isneginf(m_new), acc.type(0), m_new)
            s -= base
            np.exp(s, out=s)
            alpha = np.exp(m - base)
            denom *= alpha
            denom += s.sum(axis=-1, keepdims=True)
            acc_o *= alpha
            acc_o += s @ vg[:, :, :, j0:j1]
            m = m_new

        seen = denom > 0
        o = np.where(seen, acc_o / np.where(seen, denom, 1), 0)
        result[:, i0:i1] = o.transpose(0, 3, 1, 2, 4).reshape(batch, nq, nheads, hd_v)
        if lse_all is not None:
            with np.errstate(divide="ignore"):
                lse = np.where(seen, m + np.log(denom), -np.inf)
            lse_all[:, :, i0:i1] = lse.reshape(batch, nheads, nq)

    if lse_all is not None:
        return result, lse_all
    return result


# --------------------------------------------------------------------------------------------
# Selective scan
# --------------------------------------------------------------------------------------------


def _time_major_groups(m: _Array, groups: int, acc: np.dtype) -> _Array:
    """Varying B/C (batch, [ngroups,] dstate, seqlen) -> (seqlen, batch, groups, dstate, 1)."""
    if m.ndim == 3:
        m = m[:, None]
    if m.shape[1] != groups:
        m = np.repeat(m, groups // m.shape[1], axis=1)
    return np.ascontiguousarray(m.transpose(3, 0, 1, 2), dtype=acc)[..., None]


def _scan_chunk(a: _Array, b: _Array) -> None:
    """In place, along axis 0: (a, b)[t] <- (a, b)[t] composed with all earlier steps, so that
    afterwards x_t = a[t] * x_start + b[t] for the recurrence x_t = a_t * x_{t-1} + b_t."""
    n = a.shape[0]
    shift = 1
    while shift < n:
        b[shift:] += a[shift:] * b[:-shift]  # uses a[t] before it is combined below
        a[shift:] *= a[:-shift]  # numpy reads overlapping inputs as if copied first
        shift *= 2


def selective_scan_fn(
    u: _Array,
    delta: _Array,
    A: _Array,
    B: _Array,
    C: _Array,
    D: _Array | None = None,
    z: _Array | None = None,
    delta_bias: _Array | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: _Array | None = None,
) -> _Array | tuple[_Array, _Array]:
    """Selective scan with mamba_ssm's shapes and math.

    u, delta, z: (batch, dim, seqlen); A: (dim, dstate); B, C: (dim, dstate) fixed or
    (batch, dstate, seqlen) / (batch, ngroups, dstate, seqlen) varying (channel d uses group
    d // (dim // ngroups)); D, delta_bias: (dim,). Per step: dt = delta + delta_bias (softplus
    if asked); x = exp(dt * A) * x + dt * B * u; y = sum_n C * x + D * u; out = y * silu(z).

    Computes in float32 (float64 if any of u, delta, A, B, C is float64), starting from
    `initial_state` (batch, dim, dstate) or zeros. Returns out in u's dtype, and with
    `return_last_state` also the final state (batch, dim, dstate) in the compute dtype.
    """
    acc = _compute_dtype(u, delta, A, B, C)
    batch, dim, seqlen = u.shape
    dstate = A.shape[-1]

    b_var, c_var = B.ndim >= 3, C.ndim >= 3
    groups = 1
    for m, var in ((B, b_var), (C, c_var)):
        if var:
            g = m.shape[1] if m.ndim == 4 else 1
            groups = groups * g // math.gcd(groups, g)
    gdim = dim // groups if groups else 0

    # Time-major copies: (seqlen, batch, groups, gdim, 1) and varying B/C (..., groups, 1, dstate).
    def time_major(x: _Array) -> _Array:
        return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=acc)

    u_t = time_major(u)
    dt_t = time_major(delta)
    if delta_bias is not None:
        dt_t = dt_t + delta_bias.astype(acc)
    if delta_softplus:
        dt_t = _softplus(dt_t)
    du_t = (dt_t * u_t).reshape(seqlen, batch, groups, gdim, 1)
    dt_t = dt_t.reshape(seqlen, batch, groups, gdim, 1)

    a_w = A.astype(acc).reshape(groups, gdim, dstate)
    if b_var:
        b_t = _time_major_groups(B, groups, acc).swapaxes(-1, -2)  # (L, batch, groups, 1, N)
    else:
        b_w = B.astype(acc).reshape(groups, gdim, dstate)
    if c_var:
        c_t = _time_major_groups(C, groups, acc)  # (L, batch, groups, N, 1)
    else:
        c_w = C.astype(acc).reshape(groups, gdim, dstate)

    if initial_state is not None:
        x = initial_state.astype(acc).reshape(batch, groups, gdim, dstate)
    else:
        x = np.zeros((batch, groups, gdim, dstate), dtype=acc)

    y_t = np.empty((seqlen, batch, dim), dtype=acc)
    chunk = max(1, min(seqlen, _SCAN_BUDGET // max(1, batch * dim * dstate)))
    for t0 in range(0, seqlen, chunk):
        t1 = min(t0 + chunk, seqlen)
        a = np.exp(dt_t[t0:t1] * a_w)  # (T, batch, groups, gdim, N)
        b = du_t[t0:t1] * (b_t[t0:t1] if b_var else b_w)
        _scan_chunk(a, b)
        a *= x
        a += b
        xs = a  # the states after each step of the chunk
        if c_var:
            y = (xs @ c_t[t0:t1])[..., 0]
        else:
            y = (xs * c_w).sum(axis=-1)
        y_t[t0:t1] = y.reshape(t1 - t0, batch, dim)
        x = xs[-1]

    if D is not None:
        y_t += D.astype(acc) * u_t
    if z is not None:
        y_t *= _silu(time_major(z))
    result = np.ascontiguousarray(y_t.transpose(1, 2, 0), dtype=u.dtype)
    if return_last_state:
        return result, np.array(x.reshape(batch, dim, dstate), dtype=acc)
    return result


def selective_state_update(
    state: _Array,
    x: _Array,
    dt: _Array,
    A: _Array,
    B: _Array,
    C: _Array,
    D: _Array | None = None,
    z: _Array | None = None,
    dt_bias: _Array | None = None,
    dt_softplus: bool = False,
) -> _Array:
    """One decode step of the selective scan, mamba_ssm's `selective_state_update`.

    state: (batch, dim, dstate) or (batch, nheads, dim, dstate), updated in place; x, dt, z:
    (batch, dim) or (batch, nheads, dim); A: (dim, dstate) or (nheads, dim, dstate); B, C:
    (batch, dstate) or (batch, ngroups, dstate) (head h uses group h // (nheads // ngroups));
    D, dt_bias: (dim,) or (nheads, dim). state = state * exp(dt * A) + dt * B * x;
    out = sum_n state * C + D * x, times silu(z). Computes in float32 (float64 if state or x
    is float64); returns out in x's dtype.
    """
    acc = _compute_dtype(state, x)
    heads = state.ndim == 4
    st = state if heads else state[:, None]  # a view: writes reach the caller's array

    def with_heads(a: _Array | None, axis: int) -> _Array | None:
        if a is None:
            return None
        a = a.astype(acc)
        return a if heads else np.expand_dims(a, axis)

    x_h = with_heads(x, 1)  # (batch, nheads, dim)
    dt_h = with_heads(dt, 1)
    z_h = with_heads(z, 1)
    a_h = with_heads(A, 0)  # (nheads, dim, dstate)
    d_h = with_heads(D, 0)  # (nheads, dim)
    bias_h = with_heads(dt_bias, 0)
    nheads = st.shape[1]

    def per_head(m: _Array) -> _Array:
        m = m.astype(acc)
        if m.ndim == 2:
            m = m[:, None]
        if m.shape[1] != nheads:
            m = np.repeat(m, nheads // m.shape[1], axis=1)
        return m[:, :, None, :]  # (batch, nheads, 1, dstate)

    if bias_h is not None:
        dt_h = dt_h + bias_h
    if dt_softplus:
        dt_h = _softplus(dt_h)
    dt_e = dt_h[..., None]
    new = st.astype(acc) * np.exp(dt_e * a_h) + dt_e * per_head(B) * x_h[..., None]
    st[...] = new
    y = (new * per_head(C)).sum(axis=-1)
    if d_h is not None:
        y += d_h * x_h
    if z_h is not None:
        y *= _silu(z_h)
    return y.reshape(x.shape).astype(x.dtype)
