"""NumPy reference backward passes of flashscan's operations.

The gradients of `reference.flash_attn_func` and `reference.selective_scan_fn`, computed on the
host the way the CUDA backward kernels compute them, for the CPU fallback and the CPU tests.
Like the forward references they take NumPy arrays (float16, float32 or float64) and check
nothing beyond what the math needs.

- `flash_attn_bwd`: dq, dk, dv from the saved out and lse. The probabilities are recomputed
  blockwise (query blocks, and key blocks inside each) as exp(scores - lse), so memory stays
  O(seqlen * headdim) plus one block of scores.
- `selective_scan_bwd`: every input's gradient from the upstream gradients of out and of the
  last state. A forward sweep keeps the state at chunk boundaries only; chunks are then walked
  in reverse, recomputing the states inside each chunk and running the adjoint recurrence
  backwards, both with the same log-depth scan as the forward.
"""

from __future__ import annotations

import math

import numpy as np

from .reference import _compute_dtype, _scan_chunk, _time_major_groups

__all__ = ["flash_attn_bwd", "selective_scan_bwd"]

# Attention tiling, as in the forward: keys in blocks of _BLOCK_K, queries in blocks of at most
# _BLOCK_Q_MAX rows, fewer when batch * nheads is large, so that one block of scores holds at
# most about _SCORE_BUDGET elements.
_BLOCK_K = 128
_BLOCK_Q_MAX = 256
_SCORE_BUDGET = 1 << 21

# Scan chunking: a chunk of T steps, with T * batch * dim * dstate about _SCAN_BUDGET, is
# recomputed and back-propagated at once. States are kept at the start of every "super-chunk"
# of about sqrt(number of chunks) chunks, and inside the super-chunk being walked at the start
# of each of its chunks: O(sqrt(seqlen / T)) states in all.
_SCAN_BUDGET = 1 << 16

_Array = np.ndarray


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


def flash_attn_bwd(
    dout: _Array,
    q: _Array,
    k: _Array,
    v: _Array,
    out: _Array,
    lse: _Array,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    *,
    accum_dtype: np.dtype = np.float32,
) -> tuple[_Array, _Array, _Array]:
    """Gradients (dq, dk, dv) of `reference.flash_attn_func`'s output w.r.t. q, k and v.

    dout, out: (batch, seqlen_q, nheads, headdim_v), the upstream gradient and the forward's
    output; lse: (batch, nheads, seqlen_q), the natural-log sum of exp(scores) per query row
    (-inf for a row that sees no key), as `flash_attn_func(return_lse=True)` returns it.
    The other arguments are the forward's. With P = exp(S - lse) recomputed from q and k
    (S: scaled, soft-capped and masked scores) and Di = rowsum(dout * out):
    dV = P^T dO; dS = P * (dO V^T - Di), times 1 - tanh^2 under the softcap;
    dq = scale * dS K, dk = scale * dS^T q. GQA/MQA: dk, dv sum over the query heads of a group.
    A row that sees no key contributes nothing (its dq is 0).

    Accumulates in `accum_dtype`. In float64 the float32 lse is first refined (one more pass over
    the key blocks of each query block) so that the probabilities are float64-exact. Returns dq,
    dk, dv in the dtypes and shapes of q, k, v.
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

    def by_group(x: _Array) -> _Array:
        """(batch, seqlen_q, nheads, d) -> (batch, nheads_k, group, seqlen_q, d) in acc (copy)."""
        d = x.shape[3]
        return x.reshape(batch, sq, nheads_k, group, d).transpose(0, 2, 3, 1, 4).astype(acc)

    qg = by_group(q)
    qg *= acc.type(scale)  # the scale folded into q, as in the forward
    kg = np.ascontiguousarray(k.transpose(0, 2, 1, 3), dtype=acc)[:, :, None]
    vg = np.ascontiguousarray(v.transpose(0, 2, 1, 3), dtype=acc)[:, :, None]
    dog = by_group(dout)
    # Di = rowsum(dO * O): (batch, nheads_k, group, seqlen_q, 1).
    d_rows = (dog * by_group(out)).sum(axis=-1, keepdims=True)
    # A row that sees no key has lse -inf; +inf there makes exp(S - lse) 0 instead of NaN.
    lse_g = lse.reshape(batch, nheads_k, group, sq, 1).astype(acc)
    lse_g[np.isneginf(lse_g)] = np.inf
    refine = acc == np.float64 and lse.dtype != np.float64

    dq = np.zeros((batch, nheads_k, group, sq, hd), dtype=acc)
    dk = np.zeros((batch, nheads_k, sk, hd), dtype=acc)
    dv = np.zeros((batch, nheads_k, sk, hd_v), dtype=acc)

    block_k = _BLOCK_K
    block_q = max(1, min(sq, _BLOCK_Q_MAX, _SCORE_BUDGET // max(1, batch * nheads * block_k)))
    cap = acc.type(softcap) if softcap > 0 else None

    def probs(
        qb: _Array, i0: int, i1: int, j0: int, j1: int, lse_b: _Array
    ) -> tuple[_Array, _Array | None]:
        """P = exp(S - lse) for queries i0:i1 (qb: their scaled q) and keys j0:j1, and
        tanh(raw / cap) under the softcap."""
        s = qb @ kg[:, :, :, j0:j1].swapaxes(-1, -2)  # (batch, nheads_k, group, nq, nk)
        th = None
        if cap is not None:
            s /= cap
            th = np.tanh(s)
            s = th * cap
        full = (right_b is None or j1 - 1 <= i0 + offset + right_b) and (
            left_b is None or j0 >= i1 - 1 + offset - left_b
        )
        if not full:
            pos = np.arange(i0, i1)[:, None] + offset
            key = np.arange(j0, j1)[None, :]
            visible = np.ones((i1 - i0, j1 - j0), dtype=bool)
            if right_b is not None:
                visible &= key <= pos + right_b
            if left_b is not None:
                visible &= key >= pos - left_b
            s += np.where(visible, acc.type(0), acc.type(-np.inf))
        s -= lse_b
        np.exp(s, out=s)
        return s, th

    for i0 in range(0, sq, block_q):
        i1 = min(i0 + block_q, sq)
        qb = qg[:, :, :, i0:i1]
        dob = dog[:, :, :, i0:i1]
        db = d_rows[:, :, :, i0:i1]
        lse_b = lse_g[:, :, :, i0:i1]

        # Keys any row of this query block may see; blocks outside are skipped.
        j_lo = 0 if left_b is None else max(0, i0 + offset - left_b)
        j_hi = sk if right_b is None else min(sk, i1 - 1 + offset + right_b + 1)
        blocks = [(j0, min(j0 + block_k, j_hi)) for j0 in range(j_lo, j_hi, block_k)]

        if refine:
            # lse holds float32 roundings: rowsum(exp(S - lse)) = exp(lse_exact - lse).
            rowsum = np.zeros_like(lse_b)
            for j0, j1 in blocks:
                rowsum += probs(qb, i0, i1, j0, j1, lse_b)[0].sum(axis=-1, keepdims=True)
            lse_b = lse_b + np.log(np.where(rowsum > 0, rowsum, 1))

        dqb = np.zeros((batch, nheads_k, group, i1 - i0, hd), dtype=acc)
        for j0, j1 in blocks:
            p, th = probs(qb, i0, i1, j0, j1, lse_b)
            dv[:, :, j0:j1] += (p.swapaxes(-1, -2) @ dob).sum(axis=2)
            ds = dob @ vg[:, :, :, j0:j1].swapaxes(-1, -2)  # dP
            ds -= db
            ds *= p
            if th is not None:
                ds *= 1 - th * th  # d(cap * tanh(x / cap)) / dx
            dqb += ds @ kg[:, :, :, j0:j1]
            dk[:, :, j0:j1] += (ds.swapaxes(-1, -2) @ qb).sum(axis=2)  # qb carries the scale
        dqb *= acc.type(scale)
        dq[:, :, :, i0:i1] = dqb

    dq_out = dq.transpose(0, 3, 1, 2, 4).reshape(batch, sq, nheads, hd).astype(q.dtype)
    dk_out = dk.transpose(0, 2, 1, 3).astype(k.dtype)
    dv_out = dv.transpose(0, 2, 1, 3).astype(v.dtype)
    return dq_out, dk_out, dv_out


# --------------------------------------------------------------------------------------------
# Selective scan
# --------------------------------------------------------------------------------------------


def _sigmoid(x: _Array) -> _Array:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _sum_to_groups(g: _Array, groups: int) -> _Array:
    """(..., groups_lcm, dstate) summed down to (..., groups, dstate); lcm group h belongs to
    group h // (groups_lcm // groups), the mapping of `_time_major_groups`' repeat."""
    lcm = g.shape[-2]
    return g.reshape(*g.shape[:-2], groups, lcm // groups, g.shape[-1]).sum(axis=-2)


def selective_scan_bwd(
    dout: _Array,
    u: _Array,
    delta: _Array,
    A: _Array,
    B: _Array,
    C: _Array,
    D: _Array | None = None,
    z: _Array | None = None,
    delta_bias: _Array | None = None,
    delta_softplus: bool = False,
    initial_state: _Array | None = None,
    dlast_state: _Array | None = None,
) -> tuple[
    _Array,
    _Array,
    _Array,
    _Array,
    _Array,
    _Array | None,
    _Array | None,
    _Array | None,
    _Array | None,
]:
    """Gradients of `reference.selective_scan_fn`'s (out, last_state) w.r.t. every input.

    dout: (batch, dim, seqlen), the gradient reaching out; dlast_state: (batch, dim, dstate), the
    gradient reaching the returned last state (None: 0, as when the state is not returned).
    The other arguments are the forward's (same shapes and meaning). With x_t the states, g_t the
    total gradient reaching x_t (g_{L-1} = dlast_state + dy_{L-1} C_{L-1},
    g_t = exp(dt_{t+1} A) g_{t+1} + dy_t C_t), dy = dout * silu(z):
    dC_t = dy_t x_t; dB_t = g_t dt_t u_t; dA = sum g_t dt_t exp(dt_t A) x_{t-1};
    ddt_t = sum_n g_t (A exp(dt_t A) x_{t-1} + B_t u_t); du_t = dt_t sum_n g_t B_t + D dy_t;
    dinitial_state = exp(dt_0 A) g_0; softplus' = sigmoid; dB, dC of shared (fixed or grouped)
    matrices sum over the channels (and steps, batch) sharing them.

    Computes in the forward's dtype (float32, or float64 if any of u, delta, A, B, C is
    float64). Returns (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state): du, ddelta,
    dz in u's, delta's, z's dtypes; the others in the compute dtype; each in its input's shape,
    None where that input is None.
    """
    acc = _compute_dtype(u, delta, A, B, C)
    batch, dim, seqlen = u.shape
    dstate = A.shape[-1]

    b_var, c_var = B.ndim >= 3, C.ndim >= 3
    b_groups = (B.shape[1] if B.ndim == 4 else 1) if b_var else 1
    c_groups = (C.shape[1] if C.ndim == 4 else 1) if c_var else 1
    groups = 1
    for g, var in ((b_groups, b_var), (c_groups, c_var)):
        if var:
            groups = groups * g // math.gcd(groups, g)
    gdim = dim // groups if groups else 0

    # Time-major (seqlen, batch, groups, gdim, 1), as in the forward.
    def time_major(x: _Array) -> _Array:
        return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=acc).reshape(
            seqlen, batch, groups, gdim, 1
        )

    u_t = time_major(u)
    dt_pre = time_major(delta)
    if delta_bias is not None:
        dt_pre = dt_pre + delta_bias.astype(acc).reshape(groups, gdim, 1)
    if delta_softplus:
        dt_t = np.where(dt_pre <= 20.0, np.log1p(np.exp(np.minimum(dt_pre, 20.0))), dt_pre)
    else:
        dt_t = dt_pre
    dtu_t = dt_t * u_t
    dout_t = time_major(dout)
    z_t = time_major(z) if z is not None else None
    d_w = D.astype(acc).reshape(groups, gdim, 1) if D is not None else None

    a_w = A.astype(acc).reshape(groups, gdim, dstate)
    if b_var:
        b_t = _time_major_groups(B, groups, acc).swapaxes(-1, -2)  # (L, batch, groups, 1, N)
    else:
        b_w = B.astype(acc).reshape(groups, gdim, dstate)
    if c_var:
        c_t = _time_major_groups(C, groups, acc).swapaxes(-1, -2)  # (L, batch, groups, 1, N)
    else:
        c_w = C.astype(acc).reshape(groups, gdim, dstate)

    if initial_state is not None:
        x0 = initial_state.astype(acc).reshape(batch, groups, gdim, dstate)
    else:
        x0 = np.zeros((batch, groups, gdim, dstate), dtype=acc)

    chunk = max(1, min(seqlen, _SCAN_BUDGET // max(1, batch * dim * dstate)))

    def decay_input(t0: int, t1: int) -> tuple[_Array, _Array]:
        """exp(dt A) and dt * B * u for steps t0:t1: (T, batch, groups, gdim, N) each."""
        a = np.exp(dt_t[t0:t1] * a_w)
        b = dtu_t[t0:t1] * (b_t[t0:t1] if b_var else b_w)
        return a, b

    def advance(x: _Array, t0: int, t1: int, step: int) -> list[_Array]:
        """The states at t0, t0 + step, ... (< t1), starting from x at t0 (step: a multiple of
        `chunk`; the steps are scanned a chunk at a time)."""
        starts = []
        last = t0 + (t1 - 1 - t0) // step * step  # the last state kept
        for s0 in range(t0, last + 1, chunk):
            if (s0 - t0) % step == 0:
                starts.append(x)
            if s0 < last:
                a, b = decay_input(s0, s0 + chunk)
                _scan_chunk(a, b)
                x = a[-1] * x + b[-1]
        return starts

    # Outputs in the time-major working layout.
    du_t = np.empty((seqlen, batch, groups, gdim), dtype=acc)
    ddt_t = np.empty((seqlen, batch, groups, gdim), dtype=acc)
    dz_t = np.empty((seqlen, batch, groups, gdim), dtype=acc) if z is not None else None
    da_w = np.zeros((groups, gdim, dstate), dtype=acc)
    db_w = None if b_var else np.zeros((groups, gdim, dstate), dtype=acc)
    dc_w = None if c_var else np.zeros((groups, gdim, dstate), dtype=acc)
    db_t = np.empty((seqlen, batch, groups, dstate), dtype=acc) if b_var else None
    dc_t = np.empty((seqlen, batch, groups, dstate), dtype=acc) if c_var else None
    dd_w = np.zeros((groups, gdim, 1), dtype=acc) if D is not None else None

    # g: the gradient flowing into the state at the end of the chunk being walked.
    if dlast_state is not None:
        g_next = dlast_state.astype(acc).reshape(batch, groups, gdim, dstate)
    else:
        g_next = np.zeros((batch, groups, gdim, dstate), dtype=acc)

    def chunk_bwd(x: _Array, t0: int, t1: int, g_next: _Array) -> _Array:
        """Back-propagate steps t0:t1 from the state x at t0 and the gradient g_next reaching
        the state after step t1 - 1; returns the gradient reaching the state before step t0."""
        decay, b = decay_input(t0, t1)
        a = decay.copy()
        _scan_chunk(a, b)
        a *= x
        a += b
        xs = a  # states after each step
        c = c_t[t0:t1] if c_var else c_w

        dy = dout_t[t0:t1]  # (T, batch, groups, gdim, 1)
        if z_t is not None:
            y = (xs * c).sum(axis=-1, keepdims=True)
            if d_w is not None:
                y += d_w * u_t[t0:t1]
            zc = z_t[t0:t1]
            sig = _sigmoid(zc)
            dz_t[t0:t1] = (dy * y * sig * (1 + zc * (1 - sig)))[..., 0]
            dy = dy * (zc * sig)
        if d_w is not None:
            dd_w[...] += (dy * u_t[t0:t1]).sum(axis=(0, 1))
        dc = dy * xs  # (T, batch, groups, gdim, N)
        if c_var:
            dc_t[t0:t1] = dc.sum(axis=-2)
        else:
            dc_w[...] += dc.sum(axis=(0, 1))
        del dc

        # Adjoint recurrence g_t = decay_{t+1} g_{t+1} + dy_t C_t, run forwards on the reversed
        # chunk: step r (time t1 - 1 - r) has factor decay[t + 1] (1 for r = 0, whose
        # predecessor is g_next) and input dy_t C_t.
        ga = np.empty_like(decay)
        ga[0] = 1
        ga[1:] = decay[:0:-1]
        gb = (dy * c)[::-1].copy()
        _scan_chunk(ga, gb)
        ga *= g_next
        ga += gb
        g = ga[::-1]  # the gradient reaching x_t, t0 <= t < t1
        g_prev = decay[0] * g[0]  # reaching the state before step t0

        gd = g * decay  # the gradient reaching exp(dt A) (times exp(dt A)) ...
        x_prev = np.concatenate([x[None], xs[:-1]])
        gd *= x_prev  # ... times x_{t-1}: dL/d(dt A) per state entry
        bc = b_t[t0:t1] if b_var else b_w
        gb_sum = (g * bc).sum(axis=-1, keepdims=True)  # sum_n g B
        ddt = (gd * a_w).sum(axis=-1, keepdims=True) + gb_sum * u_t[t0:t1]
        da_w[...] += (gd * dt_t[t0:t1]).sum(axis=(0, 1))
        du = gb_sum * dt_t[t0:t1]
        if d_w is not None:
            du += dy * d_w
        du_t[t0:t1] = du[..., 0]
        ddt_t[t0:t1] = ddt[..., 0]
        g *= dtu_t[t0:t1]  # dB per state entry
        if b_var:
            db_t[t0:t1] = g.sum(axis=-2)
        else:
            db_w[...] += g.sum(axis=(0, 1))
        return g_prev

    nchunks = -(-seqlen // chunk)
    span = chunk * (math.isqrt(max(nchunks - 1, 0)) + 1)  # steps per super-chunk
    super_starts = advance(x0, 0, seqlen, span)
    for si in range(len(super_starts) - 1, -1, -1):
        s0 = si * span
        s1 = min(s0 + span, seqlen)
        starts = advance(super_starts[si], s0, s1, chunk)
        for ci in range(len(starts) - 1, -1, -1):
            t0 = s0 + ci * chunk
            g_next = chunk_bwd(starts[ci], t0, min(t0 + chunk, s1), g_next)

    # The softplus' derivative, then back to the callers' layouts.
    if delta_softplus:
        ddt_t *= np.where(dt_pre <= 20.0, _sigmoid(dt_pre), 1.0)[..., 0]

    def batch_major(x: _Array, dtype: np.dtype) -> _Array:
        return np.ascontiguousarray(x.reshape(seqlen, batch, dim).transpose(1, 2, 0), dtype=dtype)

    du_out = batch_major(du_t, u.dtype)
    ddelta_out = batch_major(ddt_t, delta.dtype)
    dz_out = batch_major(dz_t, z.dtype) if z is not None else None
    dbias_out = ddt_t.sum(axis=(0, 1)).reshape(dim) if delta_bias is not None else None
    dd_out = dd_w.reshape(dim) if D is not None else None
    da_out = da_w.reshape(dim, dstate)

    def varying_out(d_t: _Array, m: _Array, m_groups: int) -> _Array:
        """(L, batch, groups, N) -> m's shape (batch, [m_groups,] N, L)."""
        d = _sum_to_groups(d_t, m_groups).transpose(1, 2, 3, 0)
        return np.ascontiguousarray(d.reshape(m.shape))

    db_out = varying_out(db_t, B, b_groups) if b_var else db_w.reshape(dim, dstate)
    dc_out = varying_out(dc_t, C, c_groups) if c_var else dc_w.reshape(dim, dstate)
    dx0_out = g_next.reshape(batch, dim, dstate) if initial_state is not None else None
    return du_out, ddelta_out, da_out, db_out, dc_out, dd_out, dz_out, dbias_out, dx0_out
