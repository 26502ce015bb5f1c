"""flashscan.torch on the CPU: the custom ops' schemas, fake implementations and autograd
formulas (torch.library.opcheck), float64 gradcheck through the NumPy references, the
top-level API's routing of grad-requiring calls, and torch.compile(fullgraph=True) with
forward and backward. The GPU side of the same ops is in test_backward_gpu.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_attention_gpu import attention_torch  # noqa: E402 - the GPU tests' float64 baselines
from test_scan_gpu import scan_ref  # noqa: E402

import flashscan  # noqa: E402
import flashscan.torch as fst  # noqa: E402

F64 = torch.float64


def rand(*shape: int, dtype: Any = F64, scale: float = 1.0, grad: bool = True) -> Any:
    t = (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype)
    return t.requires_grad_(grad)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

ATTN_CASES = [
    # (batch, sq, sk, nheads, nheads_k, hd, causal, window, softcap)
    (1, 5, 5, 2, 2, 8, False, (-1, -1), 0.0),
    (2, 4, 6, 2, 1, 8, True, (-1, -1), 0.0),  # MQA, causal, sq < sk
    (1, 6, 3, 4, 2, 16, True, (-1, -1), 0.0),  # GQA, causal, sq > sk (rows see no key)
    (1, 7, 7, 2, 2, 8, False, (2, 1), 0.0),  # sliding window
    (1, 5, 6, 2, 1, 8, False, (-1, -1), 1.5),  # softcap
    (2, 3, 9, 4, 1, 24, True, (4, -1), 2.0),  # everything at once
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=[str(c) for c in ATTN_CASES])
def test_attention_gradcheck_float64(case: tuple[Any, ...]) -> None:
    b, sq, sk, h, hk, d, causal, window, cap = case
    torch.manual_seed(hash(case) % 1000)
    q, k, v = rand(b, sq, h, d), rand(b, sk, hk, d), rand(b, sk, hk, d)

    def f(q: Any, k: Any, v: Any) -> Any:
        return fst.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=cap)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("case", ATTN_CASES, ids=[str(c) for c in ATTN_CASES])
def test_attention_grads_match_torch_autograd(case: tuple[Any, ...]) -> None:
    """float32 on the CPU (the reference path in float32) against torch float64 autograd."""
    b, sq, sk, h, hk, d, causal, window, cap = case
    torch.manual_seed(1)
    q64, k64, v64 = rand(b, sq, h, d), rand(b, sk, hk, d), rand(b, sk, hk, d)
    dout = torch.randn(b, sq, h, d, dtype=F64)
    ref = attention_torch(q64, k64, v64, None, causal, window, cap, upcast=True)[0]
    want = torch.autograd.grad(ref, (q64, k64, v64), dout)
    q, k, v = (t.detach().float().requires_grad_() for t in (q64, k64, v64))
    out = fst.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=cap)
    got = torch.autograd.grad(out, (q, k, v), dout.float())
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-6, rtol=1e-5)
    for g, w, name in zip(got, want, "qkv"):
        assert g.dtype == torch.float32, name
        torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-4, msg=name)


def test_attention_bfloat16_grads_come_back_in_bfloat16() -> None:
    q = rand(1, 4, 2, 8, dtype=torch.bfloat16)
    k = rand(1, 4, 2, 8, dtype=torch.bfloat16)
    v = rand(1, 4, 2, 8, dtype=torch.bfloat16)
    fst.flash_attn_func(q, k, v, causal=True).float().square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.dtype == torch.bfloat16
        assert torch.isfinite(t.grad.float()).all()


def test_attention_lse_is_not_differentiable() -> None:
    q, k, v = rand(1, 3, 1, 8), rand(1, 3, 1, 8), rand(1, 3, 1, 8)
    out, lse = fst.flash_attn_func(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    assert lse.shape == (1, 1, 3)


def test_attention_opcheck() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 5, 2, 8, requires_grad=True)
    k = torch.randn(1, 6, 1, 8, requires_grad=True)
    v = torch.randn(1, 6, 1, 8, requires_grad=True)
    args = (q, k, v, 0.3, -1, 0, 0.0, False)
    torch.library.opcheck(torch.ops.flashscan.flash_attn_fwd.default, args)
    out, lse = torch.ops.flashscan.flash_attn_fwd(*args)
    bargs = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse)
    torch.library.opcheck(
        torch.ops.flashscan.flash_attn_bwd.default, (*bargs, 0.3, -1, 0, 0.0, False)
    )


def test_top_level_api_routes_grad_calls_to_autograd() -> None:
    f32 = torch.float32
    q, k, v = rand(1, 4, 2, 8, dtype=f32), rand(1, 4, 2, 8, dtype=f32), rand(1, 4, 2, 8, dtype=f32)
    out = flashscan.flash_attn_func(q, k, v, causal=True)
    assert out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    with torch.no_grad():
        assert flashscan.flash_attn_func(q, k, v).grad_fn is None
    plain = flashscan.flash_attn_func(q.detach(), k.detach(), v.detach())
    assert plain.grad_fn is None and not plain.requires_grad
    with pytest.raises(ValueError, match="out: an out= array cannot take part in autograd"):
        flashscan.flash_attn_func(q, k, v, out=torch.empty(1, 4, 2, 8))


def test_attention_torch_module_rejects_bad_arguments() -> None:
    q = rand(1, 4, 2, 8)
    with pytest.raises(TypeError, match="q: flashscan.torch takes torch tensors"):
        fst.flash_attn_func(np.zeros((1, 4, 2, 8)), q, q)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="q: expected a 4-D array"):
        fst.flash_attn_func(q[0], q, q)
    with pytest.raises(TypeError, match="causal"):
        fst.flash_attn_func(q, q, q, causal="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------

SCAN_CASES = [
    # (batch, dim, seqlen, dstate, bc form, D, z, delta_bias, softplus, initial_state, last)
    (1, 3, 5, 2, "fixed", False, False, False, False, False, False),
    (2, 2, 6, 3, "varying", True, True, True, True, False, False),
    (1, 4, 4, 2, "grouped", True, False, False, True, True, True),
    (2, 2, 1, 1, "varying", False, True, True, False, True, True),  # seqlen 1, dstate 1
    (1, 2, 7, 4, "fixed", True, True, False, True, True, True),
]


def scan_inputs(case: tuple[Any, ...], dtype: Any = F64) -> tuple[list[Any], dict[str, Any]]:
    b, dim, L, n, form, has_d, has_z, has_db, softplus, has_init, _last = case
    u = rand(b, dim, L, dtype=dtype)
    delta = (torch.rand(b, dim, L, dtype=F64) * 0.5 + 0.05).to(dtype).requires_grad_()
    A = (-torch.rand(dim, n, dtype=F64) - 0.2).to(dtype if dtype == F64 else torch.float32)
    A.requires_grad_()
    if form == "fixed":
        B, C = rand(dim, n, dtype=dtype), rand(dim, n, dtype=dtype)
    elif form == "varying":
        B, C = rand(b, n, L, dtype=dtype), rand(b, n, L, dtype=dtype)
    else:
        B, C = rand(b, 2, n, L, dtype=dtype), rand(b, 2, n, L, dtype=dtype)
    pf = dtype if dtype == F64 else torch.float32
    opts: dict[str, Any] = {
        "D": rand(dim, dtype=pf) if has_d else None,
        "z": rand(b, dim, L, dtype=dtype) if has_z else None,
        "delta_bias": rand(dim, dtype=pf, scale=0.3) if has_db else None,
        "delta_softplus": softplus,
        "initial_state": rand(b, dim, n, dtype=pf) if has_init else None,
    }
    return [u, delta, A, B, C], opts


@pytest.mark.parametrize("case", SCAN_CASES, ids=[str(c) for c in SCAN_CASES])
def test_scan_gradcheck_float64(case: tuple[Any, ...]) -> None:
    torch.manual_seed(len(str(case)))
    arrays, opts = scan_inputs(case)
    names = ["D", "z", "delta_bias", "initial_state"]
    inputs = arrays + [opts[n] for n in names if opts[n] is not None]
    present = [n for n in names if opts[n] is not None]
    want_last = case[-1]

    def f(*xs: Any) -> Any:
        kw = dict(zip(present, xs[5:]))
        r = fst.selective_scan_fn(
            *xs[:5],
            **kw,
            delta_softplus=opts["delta_softplus"],
            return_last_state=want_last,
        )
        return r

    assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("case", SCAN_CASES, ids=[str(c) for c in SCAN_CASES])
def test_scan_grads_match_torch_autograd(case: tuple[Any, ...]) -> None:
    torch.manual_seed(2)
    arrays, opts = scan_inputs(case)
    y64, x64 = scan_ref(*arrays, **opts)
    dout = torch.randn_like(y64)
    dlast = torch.randn_like(x64)
    present = [t for t in [*arrays, opts["D"], opts["z"], opts["delta_bias"]] if t is not None]
    if opts["initial_state"] is not None:
        present.append(opts["initial_state"])
    want = torch.autograd.grad((y64, x64), present, (dout, dlast))

    arrays32 = [t.detach().float().requires_grad_() for t in arrays]
    opts32 = {
        k: (v.detach().float().requires_grad_() if isinstance(v, torch.Tensor) else v)
        for k, v in opts.items()
    }
    y, x = fst.selective_scan_fn(*arrays32, **opts32, return_last_state=True)
    present32 = [
        t for t in [*arrays32, opts32["D"], opts32["z"], opts32["delta_bias"]] if t is not None
    ]
    if opts32["initial_state"] is not None:
        present32.append(opts32["initial_state"])
    got = torch.autograd.grad((y, x), present32, (dout.float(), dlast.float()))
    torch.testing.assert_close(y.double(), y64.detach(), atol=1e-5, rtol=1e-4)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == present32[i].dtype
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4, msg=f"grad {i}")


def test_scan_opcheck() -> None:
    torch.manual_seed(0)
    case = (2, 2, 6, 3, "varying", True, True, True, True, True, True)
    arrays, opts = scan_inputs(case, dtype=torch.float32)
    args = (
        *arrays,
        opts["D"],
        opts["z"],
        opts["delta_bias"],
        opts["initial_state"],
        True,
        True,
    )
    torch.library.opcheck(torch.ops.flashscan.selective_scan_fwd.default, args)
    out, last, saved = torch.ops.flashscan.selective_scan_fwd(*args)
    assert saved.shape == (0,)  # nothing is saved on the CPU: the reference recomputes
    bargs = (torch.randn_like(out), torch.randn_like(last), *(a.detach() for a in arrays))
    bargs += tuple(opts[n].detach() for n in ("D", "z", "delta_bias", "initial_state"))
    bargs += (saved, True)
    torch.library.opcheck(torch.ops.flashscan.selective_scan_bwd.default, bargs)


def test_scan_top_level_api_routes_grad_calls() -> None:
    case = (1, 2, 5, 2, "varying", True, False, False, True, False, False)
    arrays, opts = scan_inputs(case, dtype=torch.float32)
    y = flashscan.selective_scan_fn(*arrays, **opts)
    assert y.grad_fn is not None
    y.sum().backward()
    assert all(t.grad is not None for t in arrays)
    with torch.no_grad():
        assert flashscan.selective_scan_fn(*arrays, **opts).grad_fn is None


def test_scan_saved_count_matches_native() -> None:
    native = flashscan._native
    if native is None:
        pytest.skip("the native module is not built")
    for seqlen in [1, 2, 7, 2047, 2048, 2049, 4095, 4096, 4097, 10**5, 10**6 + 3]:
        assert native.scan_saved_state_count(seqlen) == fst._saved_count(seqlen), seqlen


# ---------------------------------------------------------------------------------------------
# torch.compile: no graph break, same values and gradients as eager
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", [fst, flashscan], ids=["flashscan.torch", "flashscan"])
def test_compile_fullgraph_forward_and_backward(api: Any) -> None:
    """Through the adapter, and through the public API (which routes grad-requiring calls
    to the adapter's ops by the `_routes` registry; the eager run comes first)."""
    torch._dynamo.reset()
    torch.manual_seed(3)

    def block(q: Any, k: Any, v: Any, u: Any, delta: Any, A: Any, B: Any, C: Any) -> Any:
        a = api.flash_attn_func(q, k, v, causal=True)
        y = api.selective_scan_fn(u, delta, A, B, C, delta_softplus=True)
        return a.square().sum() + y.square().sum()

    q, k, v = (torch.randn(1, 6, 2, 8, requires_grad=True) for _ in range(3))
    u = torch.randn(1, 4, 6, requires_grad=True)
    delta = torch.rand(1, 4, 6, requires_grad=True)
    A = (-torch.rand(4, 3) - 0.1).requires_grad_()
    B = torch.randn(1, 3, 6, requires_grad=True)
    C = torch.randn(1, 3, 6, requires_grad=True)
    inputs = (q, k, v, u, delta, A, B, C)

    eager = block(*inputs)
    want = torch.autograd.grad(eager, inputs)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got_loss = compiled(*inputs)
    got = torch.autograd.grad(got_loss, inputs)
    torch.testing.assert_close(got_loss, eager)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
