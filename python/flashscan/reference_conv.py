"""NumPy references of the causal depthwise conv1d (causal-conv1d's semantics): forward,
backward and the decode update, in float64 (the CPU path and the tests' ground truth).

With W = weight.shape[1], H = W - 1 and xcat = [initial_states | x] along time (zeros in place
of absent initial states), per batch row b, channel c, position t:

    y[t]   = bias[c] + sum_k weight[c, k] * m_k(t) * xcat[t + k]        (k = 0 .. W-1)
    out[t] = silu(y[t]) if activation in ("silu", "swish") else y[t]
    final_states = xcat[L : L + H]                                     (the last H inputs)

m_k(t) is 1 without seq_idx; with it, the input at position t - H + k counts only when it lies
in x, seq_idx there equals seq_idx[t], and seq_idx[t] >= 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["causal_conv1d_bwd", "causal_conv1d_fn", "causal_conv1d_update"]

_F64 = np.float64


def _f64(a: Any) -> np.ndarray | None:
    return None if a is None else np.asarray(a, dtype=_F64)


def _silu(y: np.ndarray) -> np.ndarray:
    return y / (1.0 + np.exp(-y))


def _dsilu(y: np.ndarray) -> np.ndarray:
    s = 1.0 / (1.0 + np.exp(-y))
    return s * (1.0 + y * (1.0 - s))


def _uses_silu(activation: Any) -> bool:
    return activation in ("silu", "swish")


def _padded(x: np.ndarray, width: int, initial_states: np.ndarray | None) -> np.ndarray:
    """xcat: (batch, dim, H + seqlen), the initial states (or zeros) before x."""
    batch, dim, _ = x.shape
    pre = (
        np.zeros((batch, dim, width - 1), dtype=_F64) if initial_states is None else initial_states
    )
    return np.concatenate([pre, x], axis=2)


def _masks(seq_idx: np.ndarray | None, width: int, seqlen: int) -> list[np.ndarray | None]:
    """m_k as (batch, 1, seqlen) float arrays per k (None without seq_idx)."""
    if seq_idx is None:
        return [None] * width
    seq = np.asarray(seq_idx)
    out: list[np.ndarray | None] = []
    for k in range(width):
        shift = width - 1 - k  # the input at t - shift
        m = np.zeros(seq.shape, dtype=bool)
        if shift < seqlen:
            m[:, shift:] = seq[:, : seqlen - shift] == seq[:, shift:]
        m &= seq >= 0
        out.append(m[:, None, :].astype(_F64))
    return out


def _preact(
    xc: np.ndarray, w: np.ndarray, bias: np.ndarray | None, masks: list[np.ndarray | None]
) -> np.ndarray:
    batch, dim, total = xc.shape
    width = w.shape[1]
    seqlen = total - (width - 1)
    y = np.zeros((batch, dim, seqlen), dtype=_F64)
    if bias is not None:
        y += bias[None, :, None]
    for k in range(width):
        term = w[None, :, k, None] * xc[:, :, k : k + seqlen]
        m = masks[k]
        y += term if m is None else term * m
    return y


def causal_conv1d_fn(
    x: Any,
    weight: Any,
    bias: Any = None,
    initial_states: Any = None,
    return_final_states: bool = False,
    activation: Any = None,
    seq_idx: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """out (batch, dim, seqlen) float64, and final_states (batch, dim, width - 1) with
    return_final_states. x (batch, dim, seqlen); weight (dim, width); bias (dim,);
    initial_states (batch, dim, width - 1); seq_idx (batch, seqlen) integers."""
    xf, w = _f64(x), _f64(weight)
    assert xf is not None and w is not None
    width = w.shape[1]
    xc = _padded(xf, width, _f64(initial_states))
    y = _preact(xc, w, _f64(bias), _masks(seq_idx, width, xf.shape[2]))
    out = _silu(y) if _uses_silu(activation) else y
    if return_final_states:
        return out, xc[:, :, xf.shape[2] :].copy()
    return out


def causal_conv1d_bwd(
    dout: Any,
    x: Any,
    weight: Any,
    bias: Any = None,
    initial_states: Any = None,
    dfinal_states: Any = None,
    activation: Any = None,
    seq_idx: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(dx, dweight, dbias or None, dinitial_states or None) in float64: the gradients of
    sum(out * dout) + sum(final_states * dfinal_states) for `causal_conv1d_fn`'s arguments."""
    xf, w, g = _f64(x), _f64(weight), _f64(dout)
    assert xf is not None and w is not None and g is not None
    b = _f64(bias)
    init = _f64(initial_states)
    width = w.shape[1]
    seqlen = xf.shape[2]
    xc = _padded(xf, width, init)
    masks = _masks(seq_idx, width, seqlen)
    dy = g * _dsilu(_preact(xc, w, b, masks)) if _uses_silu(activation) else g
    dxc = np.zeros_like(xc)
    dw = np.zeros_like(w)
    for k in range(width):
        m = masks[k]
        gk = dy if m is None else dy * m
        dxc[:, :, k : k + seqlen] += w[None, :, k, None] * gk
        dw[:, k] = np.einsum("bct,bct->c", gk, xc[:, :, k : k + seqlen])
    df = _f64(dfinal_states)
    if df is not None:
        dxc[:, :, seqlen:] += df
    dbias = None if b is None else dy.sum(axis=(0, 2))
    dinit = None if init is None else dxc[:, :, : width - 1].copy()
    return dxc[:, :, width - 1 :].copy(), dw, dbias, dinit


def causal_conv1d_update(
    x: Any,
    conv_state: Any,
    weight: Any,
    bias: Any = None,
    activation: Any = None,
    cache_seqlens: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(out, new conv_state) in float64; the caller's state is not touched.

    x (batch, dim) or (batch, dim, seqlen); conv_state (batch, dim, state_len), state_len >=
    width - 1. Without cache_seqlens the inputs before x are the state's last width - 1 and the
    new state is the last state_len of [state | x]; with it (batch,) the state is a ring whose
    next slot is cache_seqlens[b] % state_len: the inputs before x are the width - 1 slots
    before that one, and x is written from that slot on."""
    xf, st, w = _f64(x), _f64(conv_state), _f64(weight)
    assert xf is not None and st is not None and w is not None
    squeeze = xf.ndim == 2
    if squeeze:
        xf = xf[:, :, None]
    batch, dim, n = xf.shape
    state_len = st.shape[2]
    width = w.shape[1]
    new = st.copy()
    if cache_seqlens is None:
        before = st[:, :, state_len - (width - 1) :]
        new = np.concatenate([st, xf], axis=2)[:, :, -state_len:].copy()
    else:
        lens = np.asarray(cache_seqlens).astype(np.int64)
        idx = (lens[:, None] + np.arange(-(width - 1), 0)[None, :]) % state_len  # (batch, H)
        before = np.take_along_axis(st, idx[:, None, :].repeat(dim, axis=1), axis=2)
        for t in range(n):
            slot = (lens + t) % state_len
            new[np.arange(batch), :, slot] = xf[:, :, t]
    xc = np.concatenate([before, xf], axis=2)
    y = _preact(xc, w, _f64(bias), [None] * width)
    out = _silu(y) if _uses_silu(activation) else y
    return (out[:, :, 0] if squeeze else out), new
