"""`flashscan.mamba_chunk_scan_combined` on the CPU path: the public API over the reference,
its checks (clear errors naming the argument), and the torch adapter (autograd, gradcheck in
float64, the torch.library ops and their fake implementations)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import reference_ssd as ref

torch = pytest.importorskip("torch")
import flashscan.torch as fst  # noqa: E402


def _arrays(rng, b=2, L=21, h=4, p=8, g=2, n=16, dtype=np.float32):
    f = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    return dict(
        x=f(b, L, h, p),
        dt=(f(b, L, h) * 0.5),
        A=-np.exp(f(h) * 0.5).astype(np.float32),
        B=f(b, L, g, n),
        C=f(b, L, g, n),
        D=f(h).astype(np.float32),
        z=f(b, L, h, p),
        dt_bias=(f(h) * 0.3).astype(np.float32),
        initial_states=f(b, h, p, n).astype(np.float32),
    )


def test_exported():
    assert "mamba_chunk_scan_combined" in flashscan.__all__
    assert flashscan.mamba_chunk_scan_combined.__module__ == "flashscan.ssd"


def test_numpy_matches_reference_float64():
    rng = np.random.default_rng(0)
    a = _arrays(rng)
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=8, dt_softplus=True, return_final_states=True
    )
    a64 = {k: v.astype(np.float64) for k, v in a.items()}
    want, want_f = ref.mamba_chunk_scan_combined(
        **a64, chunk_size=64, dt_softplus=True, return_final_states=True
    )
    assert out.dtype == np.float32 and final.dtype == np.float32
    assert final.shape == (2, 4, 8, 16)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(final, want_f, rtol=1e-5, atol=1e-5)


def test_only_out_by_default_and_order_of_extras():
    rng = np.random.default_rng(1)
    a = _arrays(rng, b=1)
    out = flashscan.mamba_chunk_scan_combined(**a, chunk_size=16)
    assert isinstance(out, np.ndarray)
    cu = np.array([0, 5, 21], np.int32)
    seq_idx = np.repeat(np.arange(2, dtype=np.int32), [5, 16])[None]
    res = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=16, seq_idx=seq_idx, cu_seqlens=cu, return_final_states=True,
        return_varlen_states=True,
    )  # fmt: skip
    assert len(res) == 3 and res[1].shape == (1, 4, 8, 16) and res[2].shape == (2, 4, 8, 16)
    np.testing.assert_allclose(res[2][1], res[1][0], rtol=1e-6, atol=1e-6)
    only_varlen = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=16, seq_idx=seq_idx, cu_seqlens=cu, return_varlen_states=True
    )
    assert len(only_varlen) == 2
    np.testing.assert_array_equal(only_varlen[1], res[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_cpu_dtypes(dtype):
    rng = np.random.default_rng(2)
    a = _arrays(rng)
    t = {k: torch.tensor(v) for k, v in a.items()}
    for k in ("x", "z", "B", "C", "dt"):
        t[k] = t[k].to(dtype)
    out = flashscan.mamba_chunk_scan_combined(**t, chunk_size=32, dt_softplus=True)
    assert out.dtype == dtype and out.shape == t["x"].shape
    host = {k: v.double().numpy() for k, v in t.items()}
    want = ref.mamba_chunk_scan_combined(**host, chunk_size=32, dt_softplus=True)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    np.testing.assert_allclose(out.double().numpy(), want, rtol=tol, atol=tol)


def test_d_per_channel_and_no_optionals():
    rng = np.random.default_rng(3)
    a = _arrays(rng)
    a["D"] = rng.standard_normal((4, 8)).astype(np.float32)
    out = flashscan.mamba_chunk_scan_combined(**a, chunk_size=4)
    want = ref.mamba_chunk_scan_combined(
        **{k: v.astype(np.float64) for k, v in a.items()}, chunk_size=4
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    bare = {k: a[k] for k in ("x", "dt", "A", "B", "C")}
    out = flashscan.mamba_chunk_scan_combined(**bare, chunk_size=4)
    want = ref.mamba_chunk_scan_combined(
        **{k: v.astype(np.float64) for k, v in bare.items()}, chunk_size=4
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


# --- bad input -----------------------------------------------------------------------------


def _bad(**changes):
    rng = np.random.default_rng(4)
    a = _arrays(rng, b=1)
    kw = dict(chunk_size=8)
    for k, v in changes.items():
        (kw if k in ("chunk_size", "dt_limit", "dt_softplus", "cu_seqlens", "seq_idx",
                     "return_varlen_states", "return_final_states") else a)[k] = v  # fmt: skip
    return a, kw


@pytest.mark.parametrize(
    "changes,exc,match",
    [
        (dict(x=np.zeros((1, 21, 4), np.float32)), ValueError, "x: expected a 4-D"),
        (dict(x=np.zeros((1, 21, 4, 8), np.int32)), TypeError, "x: expected dtype"),
        (dict(dt=np.zeros((1, 20, 4), np.float32)), ValueError, "dt: expected shape"),
        (dict(A=np.zeros((3,), np.float32)), ValueError, "A: expected shape"),
        (dict(B=np.zeros((1, 21, 3, 16), np.float32), C=np.zeros((1, 21, 3, 16), np.float32)),
         ValueError, "B: ngroups 3 must divide nheads 4"),
        (dict(C=np.zeros((1, 21, 2, 8), np.float32)), ValueError, "C: expected shape"),
        (dict(C=np.zeros((1, 21, 2, 16), np.float16)), TypeError, "C: dtype float16"),
        (dict(D=np.zeros((4, 7), np.float32)), ValueError, "D: expected shape"),
        (dict(z=np.zeros((1, 21, 4, 8), np.float16)), TypeError, "z: dtype"),
        (dict(dt_bias=np.zeros((5,), np.float32)), ValueError, "dt_bias: expected shape"),
        (dict(initial_states=np.zeros((1, 4, 8, 15), np.float32)), ValueError, "initial_states"),
        (dict(seq_idx=np.zeros((1, 21), np.float32)), TypeError, "seq_idx: expected dtype"),
        (dict(seq_idx=np.zeros((1, 20), np.int32)), ValueError, "seq_idx: expected shape"),
        (dict(chunk_size=0), ValueError, "chunk_size: expected an int >= 1"),
        (dict(chunk_size=8.0), TypeError, "chunk_size: expected an int"),
        (dict(dt_limit=(1.0,)), TypeError, "dt_limit"),
        (dict(dt_limit=(1.0, 0.5)), ValueError, "dt_limit: low must be <= high"),
        (dict(dt_softplus="yes"), TypeError, "dt_softplus"),
        (dict(return_varlen_states=True), ValueError, "cu_seqlens: required"),
        (dict(return_varlen_states=True, cu_seqlens=np.array([0, 5, 20], np.int32)),
         ValueError, "cu_seqlens: expected non-decreasing offsets"),
        (dict(return_varlen_states=True, cu_seqlens=np.array([0, 21], np.float32)),
         TypeError, "cu_seqlens: expected dtype"),
    ],
)  # fmt: skip
def test_bad_input_raises_clearly(changes, exc, match):
    a, kw = _bad(**changes)
    with pytest.raises(exc, match=match):
        flashscan.mamba_chunk_scan_combined(**a, **kw)


def test_varlen_needs_batch_one():
    rng = np.random.default_rng(5)
    a = _arrays(rng, b=2)
    with pytest.raises(ValueError, match="batch 1"):
        flashscan.mamba_chunk_scan_combined(
            **a, chunk_size=8, cu_seqlens=np.array([0, 21], np.int32), return_varlen_states=True
        )


def test_missing_required_array():
    rng = np.random.default_rng(6)
    a = _arrays(rng)
    a["B"] = None
    with pytest.raises(TypeError, match="B"):
        flashscan.mamba_chunk_scan_combined(**a, chunk_size=8)


# --- torch adapter -------------------------------------------------------------------------


def _leaves(rng, dtype=torch.float64, **kw):
    a = _arrays(rng, **kw)
    return {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in a.items()}


def test_gradcheck_float64_all_inputs():
    rng = np.random.default_rng(7)
    t = _leaves(rng, b=1, L=11, h=2, p=3, g=1, n=4)
    names = list(t)
    seq_idx = torch.tensor([[0] * 4 + [1] * 7], dtype=torch.int32)

    def f(*args):
        kw = dict(zip(names, args))
        out, final = fst.mamba_chunk_scan_combined(
            **kw, chunk_size=4, seq_idx=seq_idx, dt_softplus=True, dt_limit=(0.0, 5.0),
            return_final_states=True,
        )  # fmt: skip
        return out, final

    assert torch.autograd.gradcheck(f, tuple(t.values()), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("reach", ["out", "final"])
def test_gradient_through_one_output_only(reach):
    """The eager path (autograd.Function) gets None for the output the loss does not use; its
    gradients must equal the custom op's (the compile path, zeros materialised)."""
    rng = np.random.default_rng(12)
    t = _leaves(rng, b=1, L=13, h=2, p=3, g=1, n=4)
    t["D"] = torch.tensor(rng.standard_normal(2), dtype=torch.float64, requires_grad=True)
    names = list(t)
    up = None

    def grads(call):
        nonlocal up
        leaves = [v.detach().clone().requires_grad_() for v in t.values()]
        out, final = call(dict(zip(names, leaves)))
        picked = out if reach == "out" else final
        if up is None:
            up = torch.randn(picked.shape, dtype=torch.float64)
        return torch.autograd.grad((picked * up).sum(), leaves, allow_unused=True)

    eager = grads(
        lambda kw: fst.mamba_chunk_scan_combined(
            **kw, chunk_size=4, dt_softplus=True, return_final_states=True
        )
    )
    op = grads(
        lambda kw: torch.ops.flashscan.mamba_chunk_scan_fwd(
            kw["x"],
            kw["dt"],
            kw["A"],
            kw["B"],
            kw["C"],
            4,
            kw["D"],
            kw["z"],
            kw["dt_bias"],
            kw["initial_states"],
            None,
            True,
            0.0,
            math.inf,
        )[:2]  # fmt: skip
    )
    for name, e, o in zip(names, eager, op):
        assert e is not None and o is not None, name
        torch.testing.assert_close(e, o, rtol=1e-10, atol=1e-12, msg=name)


def test_top_level_routes_grad_calls_and_matches_reference_bwd():
    rng = np.random.default_rng(8)
    t = _leaves(rng, dtype=torch.float32)
    t["D"] = torch.tensor(rng.standard_normal((4, 8)), dtype=torch.float32, requires_grad=True)
    out, final = flashscan.mamba_chunk_scan_combined(
        **t, chunk_size=8, dt_softplus=True, return_final_states=True
    )
    assert out.requires_grad and final.requires_grad
    dout = torch.randn_like(out)
    dfinal = torch.randn_like(final)
    ((out * dout).sum() + (final * dfinal).sum()).backward()
    host = {k: v.detach().double().numpy() for k, v in t.items()}
    want = ref.mamba_chunk_scan_combined_bwd(
        dout.double().numpy(), **host, chunk_size=64, dt_softplus=True,
        dfinal_states=dfinal.double().numpy(),
    )  # fmt: skip
    for (name, leaf), g in zip(t.items(), want):
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype, name
        np.testing.assert_allclose(
            leaf.grad.double().numpy(), g, rtol=2e-4, atol=2e-4, err_msg=name
        )


def test_absent_optionals_get_no_grad_and_varlen_is_detached():
    rng = np.random.default_rng(9)
    t = _leaves(rng, b=1)
    bare = {k: t[k] for k in ("x", "dt", "A", "B", "C")}
    out, varlen = fst.mamba_chunk_scan_combined(
        **bare, chunk_size=8, cu_seqlens=torch.tensor([0, 9, 21]), return_varlen_states=True
    )
    assert not varlen.requires_grad and varlen.shape == (2, 4, 8, 16)
    out.sum().backward()
    assert all(bare[k].grad is not None for k in bare)


def test_library_ops_opcheck():
    rng = np.random.default_rng(10)
    a = _arrays(rng, b=1, L=9, h=2, p=4, g=1, n=4)
    args = tuple(torch.tensor(a[k]) for k in ("x", "dt", "A", "B", "C"))
    opt = tuple(torch.tensor(a[k]) for k in ("D", "z", "dt_bias", "initial_states"))
    fwd = (*args, 4, *opt, None, True, 0.0, math.inf)
    torch.library.opcheck(torch.ops.flashscan.mamba_chunk_scan_fwd.default, fwd,
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip
    dout = torch.randn(1, 9, 2, 4)
    bwd = (dout, None, *args, 4, *opt, None, True, 0.0, math.inf)
    torch.library.opcheck(torch.ops.flashscan.mamba_chunk_scan_bwd.default, bwd,
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_gpu_backward_without_a_usable_device_follows_the_fallback_policy(monkeypatch):
    """The adapter's backward on CUDA tensors runs the kernels on a served device; on a device
    the backend cannot serve it follows FLASHSCAN_FALLBACK (here `error`: a clear exception
    naming the op, no silent host round trip). Checked through the op's implementation with a
    stand-in that claims to be CUDA on no usable device."""
    x = torch.ones(1, 1, 1, 1)

    class FakeCuda(torch.Tensor):
        @property
        def is_cuda(self):  # type: ignore[override]
            return True

    fx = x.as_subclass(FakeCuda)
    monkeypatch.setattr(flashscan._backend, "_policy", "error")
    with pytest.raises(flashscan.FlashscanError, match="mamba_chunk_scan_combined_bwd"):
        fst._ssd_bwd_impl(
            x, None, fx, x[..., 0], x.reshape(1), x, x, 1, None, None, None, None, None, False,
            0.0, 1.0,
        )  # fmt: skip


@pytest.mark.parametrize("api", [fst, flashscan], ids=["flashscan.torch", "flashscan"])
def test_compile_fullgraph_forward_and_backward(api):
    """torch.compile(fullgraph=True) traces the op (fake impl, registered autograd): same loss
    and gradients as eager."""
    torch._dynamo.reset()
    rng = np.random.default_rng(11)
    t = _leaves(rng, dtype=torch.float32, b=1, L=10, h=2, p=4, g=1, n=4)
    names = list(t)

    def block(*args):
        kw = dict(zip(names, args))
        out, final = api.mamba_chunk_scan_combined(
            **kw, chunk_size=4, dt_softplus=True, return_final_states=True
        )
        return out.square().sum() + final.square().sum()

    inputs = tuple(t.values())
    eager = block(*inputs)
    want = torch.autograd.grad(eager, inputs)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got_loss = compiled(*inputs)
    got = torch.autograd.grad(got_loss, inputs)
    torch.testing.assert_close(got_loss, eager)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_hot_path_key_only_for_hashable_torch_calls():
    from flashscan import ssd

    rng = np.random.default_rng(12)
    t = {k: torch.tensor(v) for k, v in _arrays(rng).items()}
    tensors = tuple(t[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias"))
    tensors += (t["initial_states"], None)
    assert ssd._key(tensors, (256, True, (0.0, math.inf), False, False)) is not None
    assert ssd._key(tensors, (256, True, [0.0, math.inf], False, False)) is None
    numpy_args = (np.zeros(1),) + tensors[1:]
    assert ssd._key(numpy_args, (256, True, (0.0, math.inf), False, False)) is None
    # CPU calls are never planned (only GPU-served signatures are)
    flashscan.mamba_chunk_scan_combined(**t, chunk_size=8)
    assert not any(k[0][3].type == "cpu" for k in ssd._PLANS)


def _bwd_native_args(**over):
    """Arguments of `_native.ssd_bwd` on host arrays (the checks run before the device one)."""
    f = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    b, L, h, p, g, n = 1, 5, 2, 4, 1, 8
    a = dict(
        x=f(b, L, h, p), dt=f(b, L, h), A=f(h), B=f(b, L, g, n), C=f(b, L, g, n), D=None,
        z=None, dt_bias=None, initial_states=None, seq_idx=None, dout=f(b, L, h, p),
        dfinal_states=None, dx=f(b, L, h, p), ddt=f(b, L, h), dA=f(h), dB=f(b, L, g, n),
        dC=f(b, L, g, n), dD=None, dz=None, ddt_bias=None, dinitial_states=None, chunk_size=64,
        dt_softplus=False, dt_min=0.0, dt_max=math.inf, stream=None,
    )  # fmt: skip
    a.update(over)
    return a


def _h(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float16)


def _half(**over) -> dict:
    """`_bwd_native_args` with x, B, C, dout and their gradients in fp16 (the 16-bit call)."""
    a = dict(
        x=_h(1, 5, 2, 4), B=_h(1, 5, 1, 8), C=_h(1, 5, 1, 8), dout=_h(1, 5, 2, 4),
        dx=_h(1, 5, 2, 4), dB=_h(1, 5, 1, 8), dC=_h(1, 5, 1, 8),
    )  # fmt: skip
    return _bwd_native_args(**(a | over))


@pytest.mark.parametrize(
    "over, exc, match",
    [
        (dict(D=np.zeros(2, np.float32)), ValueError, "dD is missing: D was given"),
        (dict(dz=np.zeros((1, 5, 2, 4), np.float32)), ValueError, "dz was given but z"),
        (dict(dx=np.zeros((1, 5, 2, 4), np.float16)), Exception, "dx"),
        (dict(dB=np.zeros((1, 5, 1, 7), np.float32)), ValueError, "dB"),
        (dict(dout=np.zeros((1, 4, 2, 4), np.float32)), ValueError, "dout"),
        (dict(dfinal_states=np.zeros((1, 2, 4, 9), np.float32)), ValueError, "dfinal_states"),
        (dict(chunk_size=100), flashscan.UnsupportedError, "chunk_size"),
        ({}, ValueError, "not a CUDA tensor"),
    ],
    ids=[
        "dD-missing",
        "dz-extra",
        "dx-dtype",
        "dB-shape",
        "dout-shape",
        "dfinal-shape",
        "chunk",
        "cpu",
    ],  # fmt: skip
)
def test_native_backward_checks_name_the_argument(over, exc, match):
    from flashscan import _native

    if _native is None:
        pytest.skip("no native module")
    with pytest.raises(exc, match=match):
        _native.ssd_bwd(**_bwd_native_args(**over))


@pytest.mark.parametrize(
    "over, exc, match",
    [
        ({}, ValueError, "not a CUDA tensor"),  # every check passed: the device is next
        (dict(dx=np.zeros((1, 5, 2, 4), np.float32)), Exception, "dx"),
        (dict(dB=np.zeros((1, 5, 1, 8), np.float32)), Exception, "dB"),
        (dict(dC=np.zeros((1, 5, 1, 8), np.float32)), Exception, "dC"),
        (dict(dout=np.zeros((1, 5, 2, 4), np.float32)), Exception, "dout"),
        (dict(C=np.zeros((1, 5, 1, 8), np.float32)), Exception, "C"),
        (dict(z=_h(1, 5, 2, 4), dz=_h(1, 5, 2, 4)), flashscan.UnsupportedError, "without z"),
        (dict(x=_h(1, 5, 4, 2).transpose(0, 1, 3, 2)), Exception, "x"),
    ],
    ids=["ok", "dx-dtype", "dB-dtype", "dC-dtype", "dout-dtype", "C-dtype", "z", "x-stride"],
)
def test_native_backward_checks_16bit_calls(over, exc, match):
    """A 16-bit call's own tensors: every gradient like its input (fp16 here), the 16-bit
    kernels only without z (`ssd_bwd_16bit` says so first), rows with unit stride."""
    from flashscan import _native

    if _native is None:
        pytest.skip("no native module")
    assert _native.ssd_bwd_16bit(False) and not _native.ssd_bwd_16bit(True)
    with pytest.raises(exc, match=match):
        _native.ssd_bwd(**_half(**over))


def test_native_backward_16bit_switches(monkeypatch):
    """FLASHSCAN_SSD_DX16=0 and the first path (FLASHSCAN_SSD_BWD=1) send 16-bit calls to the
    float32 kernels (copies), read per call; 16-bit tensors then fail the check."""
    from flashscan import _native

    if _native is None:
        pytest.skip("no native module")
    for var in ("FLASHSCAN_SSD_DX16", "FLASHSCAN_SSD_BWD"):
        monkeypatch.setenv(var, "0" if var.endswith("DX16") else "1")
        assert not _native.ssd_bwd_16bit(False)
        with pytest.raises(flashscan.UnsupportedError, match="float32 copies"):
            _native.ssd_bwd(**_half())
        monkeypatch.delenv(var)
    assert _native.ssd_bwd_16bit(False)


def _varlen_check(cu: Any, seq: Any, seqlen: int = 40, init: bool = False) -> Any:
    """ssd._varlen_offsets (the GPU varlen path's host checks) on numpy arrays."""
    from flashscan import ssd as core
    from flashscan._frameworks import NUMPY

    objs = (None,) * 8 + (np.zeros((1, 2, 3, 4), np.float32) if init else None, seq, cu)
    hands = [None] * 8 + [NUMPY if init else None, None if seq is None else NUMPY, NUMPY]
    return core._varlen_offsets(NUMPY, objs, hands, seqlen)  # type: ignore[arg-type]


def test_gpu_varlen_checks_tie_seq_idx_to_cu_seqlens() -> None:
    """The GPU's varlen states take each sequence's carried state from the state passing, whose
    resets seq_idx places: the host check passes a seq_idx that changes exactly where cu_seqlens
    starts a non-empty sequence (empty ones in between allowed), and refuses any other, a
    missing one for several sequences, and an initial state whose sequence 0 is empty."""
    cu = np.array([0, 7, 7, 30, 40], np.int64)
    seq = np.concatenate([np.full(7, 0), np.full(23, 2), np.full(10, 3)]).astype(np.int32)[None]
    got = _varlen_check(cu, seq)
    assert got.dtype == np.int32 and got.tolist() == cu.tolist()  # int64 offsets made int32
    assert _varlen_check(np.array([0, 40], np.int32), None) is not None  # one sequence, no seq_idx
    assert _varlen_check(np.array([0, 0, 40], np.int32), None).tolist() == [0, 0, 40]
    with pytest.raises(ValueError, match="seq_idx must change exactly"):
        _varlen_check(cu, None)
    shifted = np.concatenate([np.full(8, 0), np.full(22, 2), np.full(10, 3)]).astype(np.int32)
    with pytest.raises(ValueError, match="seq_idx must change exactly"):
        _varlen_check(cu, shifted[None])
    with pytest.raises(ValueError, match="cu_seqlens"):
        _varlen_check(np.array([0, 7, 39], np.int32), seq)
    with pytest.raises(ValueError, match="initial state starts sequence 0"):
        _varlen_check(np.array([0, 0, 40], np.int32), None, init=True)
    with pytest.raises(ValueError, match="initial state starts sequence 0"):
        _varlen_check(cu, seq + 1, init=True)
    assert _varlen_check(cu, seq, init=True) is not None
