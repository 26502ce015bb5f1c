"""CPU tests of the causal conv1d (`causal_conv1d_fn`, `causal_conv1d_update`): the NumPy
references against naive float64 loops, streaming with initial_states == one long call,
seq_idx resets == separate calls, channel-last == channel-first, the decode update == the
forward on the concatenated sequence, float64 gradcheck through the references (torch), the
torch ops (opcheck, torch.compile fullgraph), and the errors bad input raises."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import reference_conv as rc

WIDTHS = (2, 3, 4)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def naive_fwd(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    init: np.ndarray | None,
    silu: bool,
    seq: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Element by element: out[b, c, t] = act(bias + sum_k w[c, k] * input at t - H + k)."""
    batch, dim, seqlen = x.shape
    width = w.shape[1]
    h = width - 1

    def inp(bi: int, c: int, pos: int) -> float:
        if pos >= 0:
            return float(x[bi, c, pos])
        return 0.0 if init is None else float(init[bi, c, pos + h])

    out = np.zeros((batch, dim, seqlen))
    for bi in range(batch):
        for c in range(dim):
            for t in range(seqlen):
                acc = 0.0 if b is None else float(b[c])
                for k in range(width):
                    pos = t - h + k
                    if seq is not None and (
                        pos < 0 or seq[bi, pos] != seq[bi, t] or seq[bi, t] < 0
                    ):
                        continue
                    acc += float(w[c, k]) * inp(bi, c, pos)
                out[bi, c, t] = acc / (1 + np.exp(-acc)) if silu else acc
    final = np.zeros((batch, dim, h))
    for bi in range(batch):
        for c in range(dim):
            for j in range(h):
                final[bi, c, j] = inp(bi, c, seqlen - h + j)
    return out, final


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seqlen", [1, 2, 5, 9])
@pytest.mark.parametrize("opts", ["plain", "bias_silu", "init", "seq"])
def test_reference_matches_naive_loops(width: int, seqlen: int, opts: str) -> None:
    g = rng(width * 100 + seqlen)
    batch, dim = 2, 3
    x = g.standard_normal((batch, dim, seqlen))
    w = g.standard_normal((dim, width))
    b = g.standard_normal(dim) if opts == "bias_silu" else None
    init = g.standard_normal((batch, dim, width - 1)) if opts == "init" else None
    seq = None
    if opts == "seq":
        seq = np.sort(g.integers(0, 3, (batch, seqlen)), axis=1).astype(np.int32)
        seq[0, 0] = -1  # a padding position
    silu = opts == "bias_silu"
    want, want_final = naive_fwd(x, w, b, init, silu, seq)
    got = rc.causal_conv1d_fn(
        x,
        w,
        b,
        init,
        return_final_states=seq is None,
        activation="silu" if silu else None,
        seq_idx=seq,
    )
    if seq is None:
        got, final = got
        np.testing.assert_allclose(final, want_final, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def naive_bwd(
    dout: np.ndarray,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    init: np.ndarray | None,
    dfinal: np.ndarray | None,
    silu: bool,
) -> list[np.ndarray]:
    """Central finite differences of sum(out * dout) + sum(final * dfinal) (float64)."""

    def loss(x_: np.ndarray, w_: np.ndarray, b_: Any, i_: Any) -> float:
        out, final = naive_fwd(x_, w_, b_, i_, silu, None)
        v = float((out * dout).sum())
        return v + (0.0 if dfinal is None else float((final * dfinal).sum()))

    args = [x, w, b, init]
    grads = []
    for i, a in enumerate(args):
        if a is None:
            continue
        gr = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            hi = [v.copy() if v is not None else None for v in args]
            lo = [v.copy() if v is not None else None for v in args]
            hi[i][idx] += 1e-6
            lo[i][idx] -= 1e-6
            gr[idx] = (loss(*hi) - loss(*lo)) / 2e-6
        grads.append(gr)
    return grads


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seqlen", [1, 2, 6])
def test_reference_backward_matches_finite_differences(width: int, seqlen: int) -> None:
    g = rng(7 * width + seqlen)
    batch, dim = 2, 2
    x = g.standard_normal((batch, dim, seqlen))
    w = g.standard_normal((dim, width))
    b = g.standard_normal(dim)
    init = g.standard_normal((batch, dim, width - 1))
    dout = g.standard_normal((batch, dim, seqlen))
    dfinal = g.standard_normal((batch, dim, width - 1))
    want = naive_bwd(dout, x, w, b, init, dfinal, True)
    got = rc.causal_conv1d_bwd(dout, x, w, b, init, dfinal, "silu")
    for gg, ww in zip(got, want):
        np.testing.assert_allclose(gg, ww, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("width", WIDTHS)
def test_streaming_with_initial_states_equals_one_call(width: int) -> None:
    g = rng(width)
    x = g.standard_normal((2, 5, 40)).astype(np.float32)
    w = g.standard_normal((5, width)).astype(np.float32)
    b = g.standard_normal(5).astype(np.float32)
    whole = flashscan.causal_conv1d_fn(x, w, b, activation="silu")
    parts, state = [], None
    for lo, hi in ((0, 1), (1, 2), (2, 17), (17, 40)):  # chunks shorter than width - 1 too
        out, state = flashscan.causal_conv1d_fn(
            np.ascontiguousarray(x[:, :, lo:hi]),
            w,
            b,
            initial_states=state,
            return_final_states=True,
            activation="silu",
        )
        parts.append(out)
    np.testing.assert_allclose(np.concatenate(parts, axis=2), whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", WIDTHS)
def test_seq_idx_resets_equal_separate_calls(width: int) -> None:
    g = rng(10 + width)
    bounds = [0, 3, 4, 20, 31]
    x = g.standard_normal((1, 4, 31))
    w = g.standard_normal((4, width))
    seq = np.zeros((1, 31), dtype=np.int32)
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        seq[0, lo:hi] = i
    got = rc.causal_conv1d_fn(x, w, seq_idx=seq, activation="silu")
    for lo, hi in zip(bounds, bounds[1:]):
        want = rc.causal_conv1d_fn(x[:, :, lo:hi], w, activation="silu")
        np.testing.assert_allclose(got[:, :, lo:hi], want, rtol=1e-12, atol=1e-12)


def test_channel_last_equals_channel_first() -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 6, generator=g).transpose(
        1, 2
    )  # (batch, dim=6, seqlen=40), dim stride 1
    assert x.stride(1) == 1
    w = torch.randn(6, 4, generator=g)
    b = torch.randn(6, generator=g)
    init = torch.randn(2, 6, 3, generator=g)
    a, fa = flashscan.causal_conv1d_fn(x, w, b, init, return_final_states=True, activation="silu")
    c, fc = flashscan.causal_conv1d_fn(
        x.contiguous(), w, b, init, return_final_states=True, activation="silu"
    )
    torch.testing.assert_close(a, c)
    torch.testing.assert_close(fa, fc)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("state_len", [None, 5])
@pytest.mark.parametrize("step", [1, 3])
def test_update_equals_forward_on_the_concatenated_sequence(
    width: int, state_len: int | None, step: int
) -> None:
    g = rng(width * 10 + step)
    batch, dim, total = 2, 3, 12
    state_len = width - 1 if state_len is None else state_len
    x = g.standard_normal((batch, dim, total)).astype(np.float32)
    w = g.standard_normal((dim, width)).astype(np.float32)
    b = g.standard_normal(dim).astype(np.float32)
    want = flashscan.causal_conv1d_fn(x, w, b, activation="silu")
    state = np.zeros((batch, dim, state_len), dtype=np.float32)
    outs = []
    for lo in range(0, total, step):
        xs = x[:, :, lo : lo + step]
        xs = np.ascontiguousarray(xs[:, :, 0] if step == 1 else xs)
        o = flashscan.causal_conv1d_update(xs, state, w, b, activation="silu")
        outs.append(o[:, :, None] if step == 1 else o)
    np.testing.assert_allclose(np.concatenate(outs, axis=2), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, :, total - state_len :])


@pytest.mark.parametrize("width", WIDTHS)
def test_update_ring_buffer_equals_forward(width: int) -> None:
    g = rng(50 + width)
    batch, dim, total, state_len = 3, 2, 10, 4
    x = g.standard_normal((batch, dim, total)).astype(np.float32)
    w = g.standard_normal((dim, width)).astype(np.float32)
    want = rc.causal_conv1d_fn(x, w)
    state = np.zeros((batch, dim, state_len), dtype=np.float32)
    lens = np.zeros(batch, dtype=np.int32)
    for t in range(total):
        o = flashscan.causal_conv1d_update(
            np.ascontiguousarray(x[:, :, t]), state, w, cache_seqlens=lens
        )
        np.testing.assert_allclose(o, want[:, :, t], rtol=1e-5, atol=1e-6)
        lens += 1
    # the ring holds the last state_len inputs, slot (t % state_len) for input t
    for t in range(total - state_len, total):
        np.testing.assert_array_equal(state[:, :, t % state_len], x[:, :, t])


# ---------------------------------------------------------------------------------------------
# torch: gradcheck through the references, the ops, torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_gradcheck_float64(width: int, layout: str) -> None:
    torch = pytest.importorskip("torch")
    import flashscan.torch as fst

    g = torch.Generator().manual_seed(width)
    x = torch.randn(2, 3, 7, dtype=torch.float64, generator=g)
    if layout == "cl":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(3, width, dtype=torch.float64, generator=g)
    b = torch.randn(3, dtype=torch.float64, generator=g)
    init = torch.randn(2, 3, width - 1, dtype=torch.float64, generator=g)
    args = [t.requires_grad_() for t in (x, w, b, init)]

    def f(x: Any, w: Any, b: Any, i: Any) -> Any:
        out, fin = fst.causal_conv1d_fn(x, w, b, i, return_final_states=True, activation="silu")
        return out, fin

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("reach", ["out", "final"])
def test_gradient_through_one_output_only(reach: str) -> None:
    """The eager path (autograd.Function) gets None for the output the loss does not use; its
    gradients must equal the custom op's (the compile path, zeros materialised)."""
    torch = pytest.importorskip("torch")
    import flashscan.torch as fst

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=g)
    w = torch.randn(3, 4, dtype=torch.float64, generator=g)
    b = torch.randn(3, dtype=torch.float64, generator=g)
    init = torch.randn(2, 3, 3, dtype=torch.float64, generator=g)
    up = torch.randn(2, 3, 8 if reach == "out" else 3, dtype=torch.float64, generator=g)

    def grads(call: Any) -> list[Any]:
        leaves = [t.clone().requires_grad_() for t in (x, w, b, init)]
        out, fin = call(*leaves)
        picked = out if reach == "out" else fin
        return list(torch.autograd.grad((picked * up).sum(), leaves))

    eager = grads(lambda *a: fst.causal_conv1d_fn(*a, return_final_states=True, activation="silu"))
    op = grads(
        lambda x, w, b, i: torch.ops.flashscan.causal_conv1d_fwd(x, w, b, i, None, True, True)
    )
    for e, o in zip(eager, op):
        torch.testing.assert_close(e, o, rtol=1e-12, atol=1e-12)
    if reach == "final":  # the final states are the last 3 inputs: no gradient to w, b
        assert float(eager[1].abs().max()) == 0.0 and float(eager[2].abs().max()) == 0.0
        assert float(eager[0][..., :5].abs().max()) == 0.0


def test_gradcheck_float64_seq_idx() -> None:
    torch = pytest.importorskip("torch")
    import flashscan.torch as fst

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    seq = torch.tensor(
        [[0, 0, 0, 1, 1, 2, 2, 2, 2], [-1, 0, 0, 0, 0, 0, 1, 1, 1]], dtype=torch.int32
    )
    assert torch.autograd.gradcheck(lambda x, w: fst.causal_conv1d_fn(x, w, seq_idx=seq), (x, w))


def test_top_level_routes_grad_calls() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(1, 2, 5, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    out = flashscan.causal_conv1d_fn(x, w, activation="silu")
    out.sum().backward()
    assert x.grad is not None and w.grad is not None
    _, dw, _, _ = rc.causal_conv1d_bwd(
        np.ones((1, 2, 5)), x.detach().numpy(), w.detach().numpy(), activation="silu"
    )
    np.testing.assert_allclose(w.grad.numpy(), dw, rtol=1e-5, atol=1e-6)


def test_opcheck() -> None:
    torch = pytest.importorskip("torch")
    import flashscan.torch  # noqa: F401 - registers the ops

    x = torch.randn(2, 3, 8)
    w = torch.randn(3, 4)
    b = torch.randn(3)
    init = torch.randn(2, 3, 3)
    torch.library.opcheck(
        torch.ops.flashscan.causal_conv1d_fwd.default, (x, w, b, init, None, True, True)
    )
    torch.library.opcheck(
        torch.ops.flashscan.causal_conv1d_bwd.default,
        (torch.randn(2, 3, 8), torch.randn(2, 3, 3), x, w, b, init, None, True),
    )


def test_compile_fullgraph() -> None:
    torch = pytest.importorskip("torch")
    import flashscan.torch as fst

    torch._dynamo.reset()
    x = torch.randn(2, 4, 16, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)

    def loss(x: Any, w: Any, b: Any) -> Any:
        return fst.causal_conv1d_fn(x, w, b, activation="silu").square().sum()

    eager = torch.autograd.grad(loss(x, w, b), (x, w, b))
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x, w, b), (x, w, b))
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def _xw(width: int = 4) -> tuple[np.ndarray, np.ndarray]:
    return np.ones((1, 2, 5), np.float32), np.ones((2, width), np.float32)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"weight": np.ones((2, 5), np.float32)}, flashscan.UnsupportedError, "width 5"),
        ({"weight": np.ones((3, 4), np.float32)}, ValueError, "weight"),
        ({"weight": np.ones((2, 4), np.float16)}, TypeError, "weight"),
        ({"x": np.ones((1, 2, 5), np.int32)}, TypeError, "x"),
        ({"x": np.ones((2, 5), np.float32)}, ValueError, "x"),
        ({"bias": np.ones(3, np.float32)}, ValueError, "bias"),
        ({"initial_states": np.ones((1, 2, 2), np.float32)}, ValueError, "initial_states"),
        ({"activation": "relu"}, ValueError, "activation"),
        ({"activation": 1}, TypeError, "activation"),
        ({"seq_idx": np.zeros((1, 5), np.int64)}, TypeError, "seq_idx"),
        (
            {
                "seq_idx": np.zeros((1, 5), np.int32),
                "initial_states": np.ones((1, 2, 3), np.float32),
            },
            ValueError,
            "seq_idx",
        ),
    ],
)
def test_fn_bad_input_raises(kwargs: dict[str, Any], exc: type, match: str) -> None:
    x, w = _xw()
    args = {"x": x, "weight": w, **kwargs}
    with pytest.raises(exc, match=match):
        flashscan.causal_conv1d_fn(**args)


def test_fn_rejects_strided_x() -> None:
    x = np.ones((1, 4, 10), np.float32)[:, ::2, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        flashscan.causal_conv1d_fn(x, np.ones((2, 3), np.float32))


def test_update_bad_input_raises() -> None:
    x = np.ones((2, 3), np.float32)
    w = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="state_len"):
        flashscan.causal_conv1d_update(x, np.zeros((2, 3, 2), np.float32), w)
    with pytest.raises(TypeError, match="conv_state"):
        flashscan.causal_conv1d_update(x, np.zeros((2, 3, 3), np.float16), w)
    with pytest.raises(TypeError, match="cache_seqlens"):
        flashscan.causal_conv1d_update(
            x, np.zeros((2, 3, 3), np.float32), w, cache_seqlens=np.zeros(2, np.int64)
        )
    ro = np.zeros((2, 3, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        flashscan.causal_conv1d_update(x, ro, w)
