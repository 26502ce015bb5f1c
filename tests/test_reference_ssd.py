"""The SSD reference (`reference_ssd`) against the plain sequential recurrence it equals.

Forward: a Mamba-1-style loop over time with a scalar A per head (float64) must match the
chunked block computation for every chunk size; seq_idx resets; initial_states streaming
equals one long call; varlen states. Backward: every gradient against torch autograd through
the same loop, written in torch (float64).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashscan import reference_ssd as ref

torch = pytest.importorskip("torch")


def _inputs(rng, b=2, L=37, h=4, p=8, g=2, n=6, *, softplus=True, D2=False, seq=False, init=True):
    x = rng.standard_normal((b, L, h, p))
    dt = rng.standard_normal((b, L, h)) * 0.5
    A = -np.exp(rng.standard_normal(h) * 0.5)
    B = rng.standard_normal((b, L, g, n)) * 0.5
    C = rng.standard_normal((b, L, g, n)) * 0.5
    D = rng.standard_normal((h, p) if D2 else h)
    z = rng.standard_normal((b, L, h, p))
    bias = rng.standard_normal(h) * 0.3
    h0 = rng.standard_normal((b, h, p, n)) if init else None
    seq_idx = None
    if seq:
        seq_idx = np.sort(rng.integers(0, 4, (b, L)), axis=1).astype(np.int32)
    return dict(
        x=x,
        dt=dt,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        dt_bias=bias,
        initial_states=h0,
        seq_idx=seq_idx,
        dt_softplus=softplus,
    )


def _naive(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    lib=np,
):
    """The recurrence, one step at a time (numpy or torch; float64)."""
    b, L, h, p = x.shape
    rep = h // B.shape[2]
    v = dt + dt_bias if dt_bias is not None else dt
    if dt_softplus:
        v = lib.where(v <= 20.0, lib.log1p(lib.exp(lib.minimum(v, v * 0 + 20.0))), v)
    v = lib.clip(v, dt_limit[0], dt_limit[1]) if lib is np else v.clamp(dt_limit[0], dt_limit[1])
    if initial_states is not None:
        H = initial_states
    else:
        H = (
            lib.zeros((b, h, p, B.shape[3]))
            if lib is np
            else torch.zeros((b, h, p, B.shape[3]), dtype=torch.float64)
        )
    ys = []
    for t in range(L):
        Bt = lib.repeat(B[:, t], rep, axis=1) if lib is np else B[:, t].repeat_interleave(rep, 1)
        Ct = lib.repeat(C[:, t], rep, axis=1) if lib is np else C[:, t].repeat_interleave(rep, 1)
        decay = lib.exp(v[:, t] * A)  # (b, h)
        if seq_idx is not None:
            prev = seq_idx[:, t - 1] if t > 0 else seq_idx[:, 0] * 0
            keep = seq_idx[:, t] == prev
            decay = decay * (keep[:, None] if lib is np else keep[:, None].to(decay.dtype))
        H = (
            decay[..., None, None] * H
            + (v[:, t, :, None, None] * x[:, t, :, :, None]) * Bt[:, :, None, :]
        )
        y = (H * Ct[:, :, None, :]).sum(-1)
        if D is not None:
            y = y + (D if D.ndim == 2 else D[:, None]) * x[:, t]
        ys.append(y)
    y = lib.stack(ys, 1) if lib is np else torch.stack(ys, 1)
    if z is not None:
        y = y * z / (1 + lib.exp(-z))
    return y, H


@pytest.mark.parametrize("chunk", [1, 5, 16, 64, 256])
@pytest.mark.parametrize("seq", [False, True])
def test_forward_equals_recurrence(chunk, seq):
    rng = np.random.default_rng(chunk + 100 * seq)
    a = _inputs(rng, seq=seq, D2=chunk % 2 == 0)
    want_y, want_h = _naive(**a)
    y, h = ref.mamba_chunk_scan_combined(**a, chunk_size=chunk, return_final_states=True)
    assert y.dtype == np.float64 and h.shape == want_h.shape
    np.testing.assert_allclose(y, want_y, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)


def test_chunk_sizes_agree_long():
    rng = np.random.default_rng(1)
    a = _inputs(rng, b=1, L=700, h=2, p=4, g=1, n=8, seq=True)
    outs = [
        ref.mamba_chunk_scan_combined(**a, chunk_size=c, return_final_states=True)
        for c in (64, 128, 256)
    ]
    for y, h in outs[1:]:
        np.testing.assert_allclose(y, outs[0][0], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(h, outs[0][1], rtol=1e-10, atol=1e-10)


def test_dt_limit_and_no_softplus():
    rng = np.random.default_rng(2)
    a = _inputs(rng, softplus=False)
    a["dt"] = np.abs(a["dt"])
    want, _ = _naive(**a, dt_limit=(0.1, 0.4))
    got = ref.mamba_chunk_scan_combined(**a, chunk_size=8, dt_limit=(0.1, 0.4))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_seq_idx_resets_like_separate_calls():
    """Two packed sequences == two separate calls (the second from a zero state)."""
    rng = np.random.default_rng(3)
    a = _inputs(rng, b=1, L=50, init=False)
    seq_idx = np.zeros((1, 50), np.int32)
    seq_idx[:, 21:] = 1
    y = ref.mamba_chunk_scan_combined(**{**a, "seq_idx": seq_idx}, chunk_size=16)
    parts = []
    for sl in (slice(0, 21), slice(21, 50)):
        sub = {k: (v[:, sl] if k in ("x", "dt", "B", "C", "z") else v) for k, v in a.items()}
        parts.append(ref.mamba_chunk_scan_combined(**sub, chunk_size=16))
    np.testing.assert_allclose(y, np.concatenate(parts, axis=1), rtol=1e-10, atol=1e-10)


def test_initial_states_streaming_equals_one_call():
    rng = np.random.default_rng(4)
    a = _inputs(rng, L=90)
    y_all, h_all = ref.mamba_chunk_scan_combined(**a, chunk_size=32, return_final_states=True)
    h = a["initial_states"]
    ys = []
    for sl in (slice(0, 33), slice(33, 40), slice(40, 90)):
        sub = {k: (v[:, sl] if k in ("x", "dt", "B", "C", "z") else v) for k, v in a.items()}
        y, h = ref.mamba_chunk_scan_combined(
            **{**sub, "initial_states": h}, chunk_size=32, return_final_states=True
        )
        ys.append(y)
    np.testing.assert_allclose(np.concatenate(ys, axis=1), y_all, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, h_all, rtol=1e-10, atol=1e-10)


def test_varlen_states_are_each_sequence_final_state():
    rng = np.random.default_rng(5)
    a = _inputs(rng, b=1, L=60)
    cu = np.array([0, 10, 10, 47, 60], np.int32)
    seq_idx = np.repeat(np.arange(4, dtype=np.int32), np.diff(cu))[None]
    y, fin, vs = ref.mamba_chunk_scan_combined(
        **{**a, "seq_idx": seq_idx},
        chunk_size=16,
        cu_seqlens=cu,
        return_final_states=True,
        return_varlen_states=True,
    )
    assert vs.shape == (4, 4, 8, 6)
    np.testing.assert_allclose(vs[-1], fin[0], rtol=1e-10, atol=1e-10)
    for i in range(4):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        sub = {k: (v[:, sl] if k in ("x", "dt", "B", "C", "z") else v) for k, v in a.items()}
        if i > 0:
            sub["initial_states"] = None
        _, want = _naive(**sub) if cu[i + 1] > cu[i] else (None, np.zeros((1, 4, 8, 6)))
        np.testing.assert_allclose(vs[i], want[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "chunk,seq,softplus,D2,limit",
    [
        (8, False, True, False, (0.0, math.inf)),
        (16, True, False, True, (0.05, 0.9)),
        (64, True, True, False, (0.0, 1.0)),
        (5, False, True, True, (0.0, math.inf)),
    ],
)
def test_backward_matches_autograd_of_recurrence(chunk, seq, softplus, D2, limit):
    rng = np.random.default_rng(chunk)
    a = _inputs(rng, L=29, seq=seq, softplus=softplus, D2=D2)
    if not softplus:
        a["dt"] = np.abs(a["dt"])
    names = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
    t = {k: torch.tensor(a[k], requires_grad=True) for k in names}
    y, h = _naive(
        **t,
        seq_idx=None if a["seq_idx"] is None else torch.tensor(a["seq_idx"]),
        dt_softplus=softplus,
        dt_limit=limit,
        lib=torch,
    )
    dout = rng.standard_normal(y.shape)
    dh = rng.standard_normal(h.shape)
    ((y * torch.tensor(dout)).sum() + (h * torch.tensor(dh)).sum()).backward()
    got = ref.mamba_chunk_scan_combined_bwd(
        dout, **a, chunk_size=chunk, dt_limit=limit, dfinal_states=dh
    )
    for name, g in zip(names, got):
        np.testing.assert_allclose(g, t[name].grad.numpy(), rtol=1e-9, atol=1e-9, err_msg=name)


def test_backward_absent_optionals_are_none():
    rng = np.random.default_rng(9)
    a = _inputs(rng, init=False)
    for k in ("D", "z", "dt_bias"):
        a[k] = None
    got = ref.mamba_chunk_scan_combined_bwd(np.ones((2, 37, 4, 8)), **a, chunk_size=16)
    assert [g is None for g in got] == [False] * 5 + [True] * 4


def test_decode_steps_of_state_update_equal_the_ssd_scan():
    """Mamba-2 decode: selective_state_update with the Mamba-2 layout (A, dt, D, dt_bias
    broadcast over headdim and dstate), stepped over a sequence from the initial states, equals
    the SSD scan of that sequence (outputs and the final state)."""
    from flashscan import reference

    rng = np.random.default_rng(21)
    a = _inputs(rng, b=2, L=9, h=4, p=8, g=2, n=6)
    y, final = ref.mamba_chunk_scan_combined(**a, chunk_size=4, return_final_states=True)
    b, L, h, p = a["x"].shape
    n = a["B"].shape[-1]
    state = a["initial_states"].copy()
    A = np.broadcast_to(a["A"][:, None, None], (h, p, n))
    D = np.broadcast_to(a["D"][:, None], (h, p))
    bias = np.broadcast_to(a["dt_bias"][:, None], (h, p))
    for t in range(L):
        dt = np.broadcast_to(a["dt"][:, t, :, None], (b, h, p))
        out = reference.selective_state_update(
            state, a["x"][:, t], dt, A, a["B"][:, t], a["C"][:, t], D=D, z=a["z"][:, t],
            dt_bias=bias, dt_softplus=True,
        )  # fmt: skip
        np.testing.assert_allclose(out, y[:, t], rtol=1e-10, atol=1e-10, err_msg=f"step {t}")
    np.testing.assert_allclose(state, final, rtol=1e-10, atol=1e-10)
