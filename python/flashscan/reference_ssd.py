"""NumPy reference of Mamba-2's SSD chunked scan (`mamba_chunk_scan_combined`), forward and
backward, in float64: the CPU path of `flashscan.ssd` and the tests' ground truth.

The model, per batch b, head h (group g = h // (nheads // ngroups)), position t:

    dt'_t = clamp(softplus?(dt_t + dt_bias), dt_limit)        (softplus only with dt_softplus)
    H_t   = keep_t * exp(dt'_t * A) * H_{t-1} + dt'_t * x_t B_t^T     H: (headdim, dstate)
    y_t   = H_t C_t + D * x_t ;   out_t = y_t * silu(z_t)          (z, D optional)

with H_{-1} = initial_states (or 0). keep_t = 0 where seq_idx changes (seq_idx[b, t] !=
seq_idx[b, t-1], the id before t = 0 being 0, as mamba_ssm's kernels read it): a new sequence
starts from a zero state; initial_states belongs to sequence id 0.

It is computed the way the GPU does it (SSD's block decomposition): per chunk of `chunk_size`
positions, with cum_l the in-chunk cumulative sum of dt'*A,
    y_l   = sum_{s<=l} (C_l.B_s) exp(cum_l - cum_s) dt'_s x_s     (same sequence only)
          + exp(cum_l) C_l . H_prev                               (if no reset since chunk start)
    H_end = exp(cum_Q) H_prev + sum_s exp(cum_Q - cum_s) dt'_s x_s B_s^T
so the result does not depend on chunk_size, which the tests check against the plain
recurrence. The backward walks the chunks in reverse from the chunk-start states the forward
kept, differentiating those block formulas (no recurrence inside a chunk).

Arrays are NumPy (float16/32/64; callers widen bfloat16). Nothing is checked here beyond what
the math needs: `_checks.ssd` validates for the public API.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["mamba_chunk_scan_combined", "mamba_chunk_scan_combined_bwd", "varlen_states"]

_Array = np.ndarray
_F64 = np.float64


def _out_dtype(x: _Array) -> np.dtype:
    return np.dtype(_F64) if x.dtype == _F64 else x.dtype


def _state_dtype(x: _Array) -> np.dtype:
    """float64 for float64 inputs, float32 otherwise (states are kept in float32 on the GPU)."""
    return np.dtype(_F64) if x.dtype == _F64 else np.dtype(np.float32)


def _sigmoid(v: _Array) -> _Array:
    return 0.5 * (1.0 + np.tanh(0.5 * v))


def _dt_forward(
    dt: _Array, dt_bias: _Array | None, softplus: bool, limit: tuple[float, float]
) -> tuple[_Array, _Array, _Array]:
    """(dt' (b, L, h) float64, the pre-softplus value, the not-clamped mask) as mamba_ssm:
    softplus(v) = log1p(exp(v)) for v <= 20, v above; then clamped to dt_limit (always)."""
    v = dt.astype(_F64)
    if dt_bias is not None:
        v = v + dt_bias.astype(_F64)
    pre = v
    if softplus:
        v = np.where(pre <= 20.0, np.log1p(np.exp(np.minimum(pre, 20.0))), pre)
    lo, hi = float(limit[0]), float(limit[1])
    inside = (v >= lo) & (v <= hi)
    return np.clip(v, lo, hi), pre, inside


def _segments(seq_idx: _Array | None, batch: int, seqlen: int) -> _Array:
    """(b, L) int64: how many sequence starts (seq_idx changes, counting one at t = 0 when
    seq_idx[0] != 0) lie at or before t. Equal numbers <=> same sequence, no reset between."""
    if seq_idx is None:
        return np.zeros((batch, seqlen), np.int64)
    s = seq_idx.astype(np.int64)
    prev = np.concatenate([np.zeros((batch, 1), np.int64), s[:, :-1]], axis=1)
    return np.cumsum(s != prev, axis=1)


def _heads(m: _Array, nheads: int) -> _Array:
    """(b, L, g, n) B or C -> (b, L, h, n) float64, head h reading group h // (nheads // g)."""
    return np.repeat(m.astype(_F64), nheads // m.shape[2], axis=2)


def _to_groups(g: _Array, ngroups: int) -> _Array:
    """(b, L, h, n) per-head gradient -> (b, L, g, n), summed over each group's heads."""
    b, L, h, n = g.shape
    return g.reshape(b, L, ngroups, h // ngroups, n).sum(axis=3)


def _d_full(D: _Array | None, nheads: int, headdim: int) -> _Array | None:
    if D is None:
        return None
    d = D.astype(_F64)
    return d.reshape(nheads, headdim) if d.ndim == 2 else np.repeat(d[:, None], headdim, axis=1)


class _Chunk:
    """One chunk's block quantities for all batches and heads (float64): what the forward
    multiplies and the backward differentiates. l, s index positions inside the chunk."""

    def __init__(
        self,
        dts: _Array,
        A: _Array,
        seg: _Array,
        seg_before: _Array,
        xs: _Array,
        Bs: _Array,
        Cs: _Array,
    ) -> None:
        q = dts.shape[1]
        self.dts, self.xs, self.Bs, self.Cs = dts, xs, Bs, Cs
        self.cum = np.cumsum(dts * A, axis=1)  # (b, q, h)
        causal = np.tril(np.ones((q, q), bool))
        self.mask = causal[None] & (seg[:, :, None] == seg[:, None, :])  # (b, l, s)
        diff = self.cum[:, :, None, :] - self.cum[:, None, :, :]  # (b, l, s, h)
        self.decay = np.where(
            self.mask[..., None], np.exp(np.where(self.mask[..., None], diff, 0.0)), 0.0
        )
        self.cb = np.einsum("blhn,bshn->blsh", Cs, Bs)
        # carried state reaches position l when no reset lies in (chunk start, l]
        self.carry = (seg == seg_before[:, None]).astype(_F64)  # (b, l)
        self.e = np.exp(self.cum) * self.carry[..., None]  # (b, l, h)
        same_end = (seg == seg[:, -1:]).astype(_F64)  # (b, s)
        self.v = np.exp(self.cum[:, -1:, :] - self.cum) * same_end[..., None]  # (b, s, h)
        self.f = self.e[:, -1, :]  # (b, h): decay of the carried state over the whole chunk

    def forward(self, h_prev: _Array) -> tuple[_Array, _Array]:
        """(y (b, q, h, p) before D and z, the state after the chunk (b, h, p, n))."""
        w = self.cb * self.decay * self.dts[:, None, :, :]
        y = np.einsum("blsh,bshp->blhp", w, self.xs)
        y += np.einsum("blh,blhn,bhpn->blhp", self.e, self.Cs, h_prev)
        h_new = self.f[..., None, None] * h_prev
        h_new += np.einsum("bsh,bshp,bshn->bhpn", self.v * self.dts, self.xs, self.Bs)
        return y, h_new


def _prepare(
    x: _Array,
    dt: _Array,
    A: _Array,
    B: _Array,
    C: _Array,
    dt_bias: _Array | None,
    seq_idx: _Array | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
) -> tuple[_Array, _Array, _Array, _Array, _Array, _Array, _Array, _Array]:
    batch, seqlen, nheads, _ = x.shape
    dtp, pre, inside = _dt_forward(dt, dt_bias, dt_softplus, dt_limit)
    seg = _segments(seq_idx, batch, seqlen)
    return (
        x.astype(_F64),
        dtp,
        pre,
        inside,
        _heads(B, nheads),
        _heads(C, nheads),
        seg,
        A.astype(_F64),
    )


def _chunks(seqlen: int, chunk_size: int) -> list[slice]:
    return [slice(c, min(c + chunk_size, seqlen)) for c in range(0, seqlen, chunk_size)]


def _seg_before(seg: _Array, c0: int) -> _Array:
    return seg[:, c0 - 1] if c0 > 0 else np.zeros(seg.shape[0], np.int64)


def _scan(
    x64: _Array,
    dtp: _Array,
    A64: _Array,
    Bh: _Array,
    Ch: _Array,
    seg: _Array,
    h0: _Array,
    chunk_size: int,
) -> tuple[_Array, list[_Array]]:
    """y (b, L, h, p) before D and z, and the state entering each chunk plus the final one."""
    y = np.empty(x64.shape, _F64)
    states = [h0]
    for sl in _chunks(x64.shape[1], chunk_size):
        ch = _Chunk(
            dtp[:, sl],
            A64,
            seg[:, sl],
            _seg_before(seg, sl.start),
            x64[:, sl],
            Bh[:, sl],
            Ch[:, sl],
        )
        y[:, sl], h = ch.forward(states[-1])
        states.append(h)
    return y, states


def _initial(initial_states: _Array | None, x: _Array, dstate: int) -> _Array:
    batch, _, nheads, headdim = x.shape
    if initial_states is None:
        return np.zeros((batch, nheads, headdim, dstate), _F64)
    return initial_states.astype(_F64)


def mamba_chunk_scan_combined(
    x: _Array,
    dt: _Array,
    A: _Array,
    B: _Array,
    C: _Array,
    chunk_size: int,
    D: _Array | None = None,
    z: _Array | None = None,
    dt_bias: _Array | None = None,
    initial_states: _Array | None = None,
    seq_idx: _Array | None = None,
    cu_seqlens: _Array | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Any:
    """mamba_ssm's `mamba_chunk_scan_combined` on the host (see the module docstring).

    x, z: (batch, seqlen, nheads, headdim); dt: (batch, seqlen, nheads); A, dt_bias: (nheads,);
    B, C: (batch, seqlen, ngroups, dstate); D: (nheads,) or (nheads, headdim); initial_states:
    (batch, nheads, headdim, dstate); seq_idx: (batch, seqlen) ints; cu_seqlens: (nseq + 1,)
    ints, read only with return_varlen_states (batch must be 1).

    Returns out (x's dtype), then final_states (batch, nheads, headdim, dstate) with
    return_final_states, then varlen_states (nseq, nheads, headdim, dstate) with
    return_varlen_states (states float32, float64 for float64 x), as mamba_ssm orders them.
    """
    x64, dtp, _, _, Bh, Ch, seg, A64 = _prepare(
        x, dt, A, B, C, dt_bias, seq_idx, dt_softplus, dt_limit
    )
    h0 = _initial(initial_states, x, B.shape[-1])
    y, states = _scan(x64, dtp, A64, Bh, Ch, seg, h0, int(chunk_size))
    Dh = _d_full(D, x.shape[2], x.shape[3])
    if Dh is not None:
        y += Dh * x64
    if z is not None:
        z64 = z.astype(_F64)
        y *= z64 * _sigmoid(z64)
    result: list[_Array] = [y.astype(_out_dtype(x))]
    sd = _state_dtype(x)
    if return_final_states:
        result.append(states[-1].astype(sd))
    if return_varlen_states:
        assert cu_seqlens is not None
        result.append(
            varlen_states(
                x64, dtp, A64, Bh, cu_seqlens, h0[0] if initial_states is not None else None
            ).astype(sd)
        )
    return result[0] if len(result) == 1 else tuple(result)


def varlen_states(
    x64: _Array, dtp: _Array, A64: _Array, Bh: _Array, cu_seqlens: _Array, h0: _Array | None
) -> _Array:
    """(nseq, h, p, n): the state after each packed sequence of batch 0, each scanned alone
    from a zero state (sequence 0 from `h0`, the initial state, when given)."""
    bounds = [int(v) for v in np.asarray(cu_seqlens).reshape(-1)]
    _, _, nheads, headdim = x64.shape
    out = np.zeros((len(bounds) - 1, nheads, headdim, Bh.shape[-1]), _F64)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if i == 0 and h0 is not None:
            out[i] = h0
        if hi <= lo:
            continue
        cum = np.cumsum(dtp[0, lo:hi] * A64, axis=0)  # (s, h)
        w = np.exp(cum[-1] - cum) * dtp[0, lo:hi]
        out[i] = np.exp(cum[-1])[:, None, None] * out[i]
        out[i] += np.einsum("sh,shp,shn->hpn", w, x64[0, lo:hi], Bh[0, lo:hi])
    return out


def straddle_sums(r: _Array) -> _Array:
    """da_k = sum over the pairs l >= k > s of r[..., l, s, :] for r (b, q(l), q(s), h): the
    gradient of the increment a_k = dt'_k A through every decay exp(cum_l - cum_s) = exp(a_{s+1}
    + ... + a_l) whose span holds k, given r[l, s] = dL/d(cum_l - cum_s). Equal to the reverse
    cumulative sum of (row sum - column sum) of r, but every term enters with its own sign, so
    its rounding error is relative to sum |r| rather than to the row / column sums that nearly
    cancel (what a float32 / tf32 kernel needs; `tools/ssd_da_model.py`: its 64 x 64 block
    form)."""
    q = r.shape[1]
    # t[l, k] = sum_{s < k} r[l, s] (exclusive prefix over s), kept where l >= k
    t = np.cumsum(r, axis=2) - r
    keep = np.tril(np.ones((q, q), bool))[None, :, :, None]
    return np.where(keep, t, 0.0).sum(axis=1)


def mamba_chunk_scan_combined_bwd(
    dout: _Array,
    x: _Array,
    dt: _Array,
    A: _Array,
    B: _Array,
    C: _Array,
    chunk_size: int,
    D: _Array | None = None,
    z: _Array | None = None,
    dt_bias: _Array | None = None,
    initial_states: _Array | None = None,
    seq_idx: _Array | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    dfinal_states: _Array | None = None,
) -> tuple[_Array | None, ...]:
    """Every input's gradient from dout (like out) and dfinal_states (like final_states, or
    None): (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states) in float64; None for an
    absent optional input. Recomputes the forward's chunk-start states, then walks the chunks
    in reverse."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    x64, dtp, pre, inside, Bh, Ch, seg, A64 = _prepare(
        x, dt, A, B, C, dt_bias, seq_idx, dt_softplus, dt_limit
    )
    h0 = _initial(initial_states, x, dstate)
    y, states = _scan(x64, dtp, A64, Bh, Ch, seg, h0, int(chunk_size))
    Dh = _d_full(D, nheads, headdim)
    g = dout.astype(_F64)
    dz = None
    if z is not None:
        z64 = z.astype(_F64)
        sig = _sigmoid(z64)
        yd = y + Dh * x64 if Dh is not None else y
        dz = g * yd * sig * (1.0 + z64 * (1.0 - sig))
        g = g * z64 * sig
    dx = np.zeros_like(x64)
    dD = None
    if Dh is not None:
        dx += Dh * g
        dDh = np.einsum("blhp,blhp->hp", g, x64)
        dD = dDh if D is not None and D.ndim == 2 else dDh.sum(axis=1)
    ddt = np.zeros_like(dtp)
    dcum_all = np.zeros_like(dtp)
    da_intra = np.zeros_like(dtp)
    dBh = np.zeros_like(Bh)
    dCh = np.zeros_like(Ch)
    dh = np.zeros_like(h0) if dfinal_states is None else dfinal_states.astype(_F64)
    for k, sl in reversed(list(enumerate(_chunks(seqlen, int(chunk_size))))):
        ch = _Chunk(
            dtp[:, sl],
            A64,
            seg[:, sl],
            _seg_before(seg, sl.start),
            x64[:, sl],
            Bh[:, sl],
            Ch[:, sl],
        )
        h_prev = states[k]
        gy = g[:, sl]
        dts, xs, Bs, Cs = ch.dts, ch.xs, ch.Bs, ch.Cs
        # intra-chunk: y_l += sum_s cb[l,s] decay[l,s] dt_s x_s
        dw = np.einsum("blhp,bshp->blsh", gy, xs)  # d(weight of x_s in y_l)
        w = ch.cb * ch.decay * dts[:, None, :, :]
        dxs = np.einsum("blsh,blhp->bshp", w, gy)
        dcb = dw * ch.decay * dts[:, None, :, :]
        dCs = np.einsum("blsh,bshn->blhn", dcb, Bs)
        dBs = np.einsum("blsh,blhn->bshn", dcb, Cs)
        r = dw * w  # d(log decay)[l,s], decay = exp(cum_l - cum_s) on the mask
        # Its share of da (the gradient of the increments dt'_k A) is the straddle sum over the
        # pairs l >= k > s, formed directly (no row-sum minus column-sum cancellation).
        da_intra[:, sl] = straddle_sums(r)
        dcum = np.zeros_like(dts)
        ddts = np.einsum("blsh,blsh->bsh", dw, ch.cb * ch.decay)
        # carried state: y_l += e_l C_l . h_prev
        ch_h = np.einsum("blhn,bhpn->blhp", Cs, h_prev)
        de = np.einsum("blhp,blhp->blh", gy, ch_h)
        dcum += de * ch.e
        dCs += np.einsum("blh,blhp,bhpn->blhn", ch.e, gy, h_prev)
        dh_prev = np.einsum("blh,blhp,blhn->bhpn", ch.e, gy, Cs)
        # state out: h_new = f h_prev + sum_s v_s dt_s x_s B_s^T
        dh_prev += ch.f[..., None, None] * dh
        df = np.einsum("bhpn,bhpn->bh", dh, h_prev)
        dcum[:, -1, :] += df * ch.f
        xdhb = np.einsum("bshp,bhpn->bshn", xs, dh)  # x_s^T dh (n)
        u = np.einsum("bshn,bshn->bsh", xdhb, Bs)
        dv = u * dts
        dcum[:, -1, :] += (dv * ch.v).sum(axis=1)
        dcum -= dv * ch.v
        ddts += u * ch.v
        dxs += np.einsum("bsh,bhpn,bshn->bshp", ch.v * dts, dh, Bs)
        dBs += (ch.v * dts)[..., None] * xdhb
        dx[:, sl] += dxs
        ddt[:, sl] += ddts
        dcum_all[:, sl] = dcum
        dBh[:, sl] = dBs
        dCh[:, sl] = dCs
        dh = dh_prev
    # cum is the in-chunk cumulative sum of dt' A: d(dt'_k A) = sum_{l >= k in chunk} dcum_l
    # (the carried-state and state-out terms), plus the intra-chunk straddle sums
    da = da_intra.copy()
    for sl in _chunks(seqlen, int(chunk_size)):
        da[:, sl] += np.flip(np.cumsum(np.flip(dcum_all[:, sl], axis=1), axis=1), axis=1)
    ddt += da * A64
    dA = (da * dtp).sum(axis=(0, 1))
    # dt' = clamp(softplus?(dt + dt_bias)): no gradient where clamped
    ddt = np.where(inside, ddt, 0.0)
    if dt_softplus:
        ddt = np.where(pre <= 20.0, ddt * _sigmoid(pre), ddt)
    ddt_bias = None if dt_bias is None else ddt.sum(axis=(0, 1))
    dinit = None if initial_states is None else dh
    return (
        dx,
        ddt,
        dA,
        _to_groups(dBh, ngroups),
        _to_groups(dCh, ngroups),
        dD,
        dz,
        ddt_bias,
        dinit,
    )
