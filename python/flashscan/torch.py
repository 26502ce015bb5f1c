"""flashscan.torch: differentiable torch ops on flashscan's kernels.

    import flashscan.torch as fst
    out = fst.flash_attn_func(q, k, v, causal=True)          # q, k, v may require grad
    y = fst.selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus=True)
    loss.backward()                                         # flashscan's backward kernels

Each operation is a `torch.library` custom op (`torch.ops.flashscan.*`) with a fake (meta)
implementation and a registered autograd formula, so `torch.compile(fullgraph=True)` traces
through it without a graph break and `torch.autograd.gradcheck` can check it. In eager mode the
same functions run through a plain `torch.autograd.Function` instead: the custom-op dispatch
costs more host time than the kernels take at real-time shapes. The top-level
`flashscan.flash_attn_func` / `flashscan.selective_scan_fn` come here by themselves when a torch
input requires grad and grad mode is on: this module registers its ops in `_routes`, where the
core ops (below it; they never import it) look them up.

Where the work runs: CUDA tensors on a device the backend serves -> the CUDA kernels on the
current stream; CPU tensors -> the NumPy references (`reference`, `reference_bwd`); float64
tensors (any device) -> the NumPy references in float64 (that is what gradcheck checks);
CUDA tensors the backend cannot serve -> the fallback policy, then the references.

This is the only module that knows torch; the native entry points take DLPack descriptors.
The attention lse output is not differentiable (as in flash-attn): a loss that uses it gets
no gradient through it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from . import _backend, _checks, _routes, reference, reference_bwd
from . import attention as _attention
from . import scan as _scan
from ._frameworks import handler_of

__all__ = ["flash_attn_func", "selective_scan_fn"]

_native = _backend.native
_F64 = torch.float64
_F32 = torch.float32


# ---------------------------------------------------------------------------------------------
# Helpers: where a call runs, host copies, descriptors for `_native`
# ---------------------------------------------------------------------------------------------


def _on_gpu(t: Tensor, op: str) -> bool:
    """True when `t`'s call runs on the CUDA kernels; False for the references (CPU, float64,
    or a CUDA device the backend cannot serve: the fallback policy decides, and may raise)."""
    if not t.is_cuda or t.dtype == _F64:
        return False
    dev = t.get_device()
    if dev in _backend.usable_devices():
        return True
    _backend.on_fallback(op, _backend.device_reason(dev), depth=3)
    return False


# The API's torch handler: host copies, descriptors and the current stream, as the API does them.
_TORCH = handler_of(torch.empty(0), "tensor")


def _host(t: Tensor | None) -> np.ndarray | None:
    """A host NumPy copy (bfloat16 widened to float32, which NumPy lacks)."""
    return None if t is None else _TORCH.to_host(t)


def _from_host(a: np.ndarray, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    name = _TORCH.to_name[like.dtype if dtype is None else dtype]  # type: ignore[attr-defined]
    return _TORCH.from_host(a, name, like, None)  # type: ignore[arg-type]


def _desc(t: Tensor | None, name: str) -> Any:
    """What `_native` takes for `t`: the torch handler's descriptor tuple (None stays None)."""
    return None if t is None else _TORCH.describe(t, name)


def _dense(t: Tensor) -> Tensor:
    """`t` with a contiguous last dimension on a 16-byte boundary, as the kernels read rows
    (upstream gradients are often expanded or sliced views)."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s > 0 for s in t.stride()):
        return t
    return t.contiguous()


def _stream(t: Tensor) -> int:
    """The caller's current CUDA stream on t's device."""
    return _TORCH.stream(t.get_device())


def _none_if_empty(t: Tensor) -> Tensor | None:
    return None if t.numel() == 0 and t.dim() == 1 else t


def _absent(like: Tensor) -> Tensor:
    """The stand-in for an absent optional output (custom ops cannot return None)."""
    return like.new_empty((0,), dtype=_F32)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def _attn_fwd_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    """(out, lse); `deterministic` is only read by the backward."""
    window = (window_left, window_right)
    if q.dtype == _F64:
        o, lse = reference.flash_attn_func(
            _host(q),
            _host(k),
            _host(v),
            softmax_scale=softmax_scale,
            window_size=window,
            softcap=softcap,
            return_lse=True,
            accum_dtype=np.dtype(np.float64),
        )
        return _from_host(o, q), _from_host(lse, q)
    # The API's general path (not `flash_attn_func`, which would send a grad-requiring call
    # back here).
    return _attention._flash_attn_any(  # type: ignore[return-value]
        q, k, v, softmax_scale, False, window, softcap, True, None, None, route=False
    )


_attn_fwd = torch.library.custom_op("flashscan::flash_attn_fwd", _attn_fwd_impl, mutates_args=())


@_attn_fwd.register_fake
def _attn_fwd_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    b, sq, h, _ = q.shape
    lse_dtype = _F64 if q.dtype == _F64 else _F32
    return q.new_empty(q.shape), q.new_empty((b, h, sq), dtype=lse_dtype)


def _attn_bwd_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) from the upstream gradient and the forward's out and lse."""
    if _on_gpu(q, "flash_attn_bwd"):
        dout = _dense(dout)
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        _native.flash_attn_bwd(  # type: ignore[union-attr]
            _desc(dout, "dout"),
            _desc(q, "q"),
            _desc(k, "k"),
            _desc(v, "v"),
            _desc(out, "out"),
            _desc(lse, "lse"),
            _desc(dq, "dq"),
            _desc(dk, "dk"),
            _desc(dv, "dv"),
            softmax_scale,
            window_left,
            window_right,
            softcap,
            deterministic,
            _stream(q),
        )
        return dq, dk, dv
    acc = np.dtype(np.float64 if q.dtype == _F64 else np.float32)
    gq, gk, gv = reference_bwd.flash_attn_bwd(
        _host(dout),
        _host(q),
        _host(k),
        _host(v),
        _host(out),
        _host(lse),
        softmax_scale=softmax_scale,
        window_size=(window_left, window_right),
        softcap=softcap,
        accum_dtype=acc,
    )
    return _from_host(gq, q), _from_host(gk, k), _from_host(gv, v)


_attn_bwd = torch.library.custom_op("flashscan::flash_attn_bwd", _attn_bwd_impl, mutates_args=())


@_attn_bwd.register_fake
def _attn_bwd_fake(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attn_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, scale, wl, wr, cap, det = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (scale, wl, wr, cap, det)
    ctx.mark_non_differentiable(lse)


def _attn_grad(ctx: Any, dout: Tensor, _dlse: Tensor) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashscan.flash_attn_bwd(dout, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None


_attn_fwd.register_autograd(_attn_grad, setup_context=_attn_setup)


class _FlashAttn(torch.autograd.Function):
    """The eager path: the same impl functions without the custom-op dispatch, which costs
    ~70 us of host time per op call on the lent H100's host (torch 2.11), more than the
    kernels at real-time shapes. torch.compile traces the custom ops instead."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        out = _attn_fwd_impl(*inputs)
        _attn_setup(ctx, inputs, out)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor, _dlse: Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        return (*_attn_bwd_impl(dout, q, k, v, out, lse, *ctx.args), None, None, None, None, None)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """`flashscan.flash_attn_func` as a differentiable torch op (same arguments and layout).

    Gradients reach q, k and v (dk, dv summed over each GQA group). `deterministic=True`
    makes the backward bit-reproducible (dq is reduced in a fixed order instead of with
    atomics), at some cost in time and memory. float64 tensors run the NumPy references."""
    if not isinstance(q, Tensor):
        raise TypeError(f"q: flashscan.torch takes torch tensors, got {type(q).__name__}")
    if q.dim() != 4:
        raise ValueError(
            "q: expected a 4-D array (batch, seqlen, nheads, headdim), got shape "
            f"{_checks.fmt_shape(tuple(q.shape))} ({q.dim()}-D)"
        )
    causal = _checks.flag("causal", causal)
    return_lse = _checks.flag("return_lse", return_lse)
    deterministic = _checks.flag("deterministic", deterministic)
    wl, wr = _checks.window(window_size, causal)
    scale = (
        1.0 / math.sqrt(q.shape[-1])
        if softmax_scale is None
        else _checks.real("softmax_scale", softmax_scale)
    )
    cap = _checks.real("softcap", softcap, minimum=0.0)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flashscan.flash_attn_fwd(q, k, v, scale, wl, wr, cap, deterministic)
    else:
        out, lse = _FlashAttn.apply(q, k, v, scale, wl, wr, cap, deterministic)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------


# The forward keeps the state after every _SAVE_CHUNK steps (but the last chunk) for the
# backward, which then recomputes states only inside chunks (src/ops/scan.rs: SAVE_CHUNK).
_SAVE_CHUNK = 256


def _saved_count(seqlen: Any) -> Any:
    """How many chunk-boundary states the forward keeps for the backward (works on SymInts:
    must equal `_native.scan_saved_state_count`, which a test checks)."""
    n = (seqlen + _SAVE_CHUNK - 1) // _SAVE_CHUNK - 1
    return max(n, 0) if isinstance(n, int) else n


def _scan_fwd_impl(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],  # noqa: UP045 - torch.library parses the annotation
    z: Optional[Tensor],  # noqa: UP045
    delta_bias: Optional[Tensor],  # noqa: UP045
    initial_state: Optional[Tensor],  # noqa: UP045
    delta_softplus: bool,
    save_states: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, last_state, saved_states): saved_states (batch, dim, nsaved, dstate) float32
    when `save_states` and the call runs on the GPU, else an empty (0,) tensor."""
    if u.dtype == _F64:
        y, last = reference.selective_scan_fn(
            _host(u),
            _host(delta),
            _host(A),
            _host(B),
            _host(C),
            _host(D),
            _host(z),
            _host(delta_bias),
            delta_softplus=delta_softplus,
            return_last_state=True,
            initial_state=_host(initial_state),
        )
        return _from_host(y, u), _from_host(last, u), _absent(u)
    saved = _absent(u)
    if save_states and u.is_cuda:
        batch, dim, seqlen = u.shape
        shape = (batch, dim, _saved_count(seqlen), A.shape[-1])
        if u.get_device() in _backend.usable_devices():
            saved = u.new_empty(shape, dtype=_F32)  # the forward kernel fills it
        else:  # the fallback: the shape the fake promises; the reference backward ignores it
            saved = u.new_zeros(shape, dtype=_F32)
    # The API's general path (not `selective_scan_fn`, which would route back here).
    out, last = _scan._scan_any(
        u,
        delta,
        A,
        B,
        C,
        D,
        z,
        delta_bias,
        delta_softplus,
        True,
        initial_state,
        None,
        route=False,
        saved_states=None if saved.dim() == 1 else saved,
    )
    return out, last, saved


_scan_fwd = torch.library.custom_op(
    "flashscan::selective_scan_fwd", _scan_fwd_impl, mutates_args=()
)


@_scan_fwd.register_fake
def _scan_fwd_fake(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],  # noqa: UP045
    z: Optional[Tensor],  # noqa: UP045
    delta_bias: Optional[Tensor],  # noqa: UP045
    initial_state: Optional[Tensor],  # noqa: UP045
    delta_softplus: bool,
    save_states: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    batch, dim, seqlen = u.shape
    dstate = A.shape[-1]
    acc = _F64 if u.dtype == _F64 else _F32
    last = u.new_empty((batch, dim, dstate), dtype=acc)
    if save_states and u.is_cuda and u.dtype != _F64:
        saved = u.new_empty((batch, dim, _saved_count(seqlen), dstate), dtype=_F32)
    else:
        saved = _absent(u)
    return u.new_empty(u.shape), last, saved


def _scan_bwd_impl(
    dout: Tensor,
    dlast_state: Optional[Tensor],  # noqa: UP045
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],  # noqa: UP045
    z: Optional[Tensor],  # noqa: UP045
    delta_bias: Optional[Tensor],  # noqa: UP045
    initial_state: Optional[Tensor],  # noqa: UP045
    saved_states: Tensor,
    delta_softplus: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state), each in its input's
    dtype; an absent input's gradient is an empty (0,) tensor."""
    if _on_gpu(u, "selective_scan_bwd"):
        dout = _dense(dout)
        f32 = _F32
        du, ddelta = u.new_empty(u.shape), delta.new_empty(delta.shape)
        da = A.new_empty(A.shape, dtype=f32)
        db = B.new_empty(B.shape, dtype=f32)
        dc = C.new_empty(C.shape, dtype=f32)
        dd = None if D is None else D.new_empty(D.shape, dtype=f32)
        dz = None if z is None else z.new_empty(z.shape)
        ddb = None if delta_bias is None else delta_bias.new_empty(delta_bias.shape, dtype=f32)
        dinit = (
            None
            if initial_state is None
            else initial_state.new_empty(initial_state.shape, dtype=f32)
        )
        saved = _none_if_empty(saved_states)
        dlast = None if dlast_state is None else _dense(dlast_state.to(f32))
        _native.selective_scan_bwd(  # type: ignore[union-attr]
            _desc(u, "u"),
            _desc(delta, "delta"),
            _desc(A, "A"),
            _desc(B, "B"),
            _desc(C, "C"),
            _desc(D, "D"),
            _desc(z, "z"),
            _desc(delta_bias, "delta_bias"),
            _desc(initial_state, "initial_state"),
            _desc(dout, "dout"),
            _desc(saved, "saved_states"),
            _desc(dlast, "dlast_state"),
            _desc(du, "du"),
            _desc(ddelta, "ddelta"),
            _desc(da, "dA"),
            _desc(db, "dB"),
            _desc(dc, "dC"),
            _desc(dd, "dD"),
            _desc(dz, "dz"),
            _desc(ddb, "ddelta_bias"),
            _desc(dinit, "dinitial_state"),
            delta_softplus,
            _stream(u),
        )
        grads: tuple[Tensor | None, ...] = (du, ddelta, da, db, dc, dd, dz, ddb, dinit)
    else:
        host = reference_bwd.selective_scan_bwd(
            _host(dout),
            _host(u),
            _host(delta),
            _host(A),
            _host(B),
            _host(C),
            _host(D),
            _host(z),
            _host(delta_bias),
            delta_softplus=delta_softplus,
            initial_state=_host(initial_state),
            dlast_state=_host(dlast_state),
        )
        grads = tuple(
            None if g is None else _from_host(g, like)
            for g, like in zip(host, (u, delta, A, B, C, D, z, delta_bias, initial_state))
        )
    likes = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    return tuple(  # type: ignore[return-value]
        _absent(u) if g is None else (g if g.dtype == like.dtype else g.to(like.dtype))
        for g, like in zip(grads, likes)
    )


_scan_bwd = torch.library.custom_op(
    "flashscan::selective_scan_bwd", _scan_bwd_impl, mutates_args=()
)


@_scan_bwd.register_fake
def _scan_bwd_fake(
    dout: Tensor,
    dlast_state: Optional[Tensor],  # noqa: UP045
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],  # noqa: UP045
    z: Optional[Tensor],  # noqa: UP045
    delta_bias: Optional[Tensor],  # noqa: UP045
    initial_state: Optional[Tensor],  # noqa: UP045
    saved_states: Tensor,
    delta_softplus: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    likes = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    return tuple(  # type: ignore[return-value]
        _absent(u) if t is None else t.new_empty(t.shape) for t in likes
    )


def _scan_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, _save = inputs
    _out, _last, saved = output
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, initial_state, saved)
    ctx.delta_softplus = delta_softplus
    ctx.mark_non_differentiable(saved)


def _scan_grad(ctx: Any, dout: Tensor, dlast: Tensor, _dsaved: Tensor) -> tuple[Any, ...]:
    return _scan_grads(ctx, torch.ops.flashscan.selective_scan_bwd, dout, dlast)


def _scan_grads(ctx: Any, bwd: Any, dout: Tensor, dlast: Tensor) -> tuple[Any, ...]:
    u, delta, A, B, C, D, z, delta_bias, initial_state, saved = ctx.saved_tensors
    grads = bwd(
        dout, dlast, u, delta, A, B, C, D, z, delta_bias, initial_state, saved, ctx.delta_softplus
    )
    present = (True, True, True, True, True, D is not None, z is not None)
    present += (delta_bias is not None, initial_state is not None)
    return tuple(g if p else None for g, p in zip(grads, present)) + (None, None)


_scan_fwd.register_autograd(_scan_grad, setup_context=_scan_setup)


class _SelectiveScan(torch.autograd.Function):
    """The eager path of the scan (see `_FlashAttn`)."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        out = _scan_fwd_impl(*inputs)
        _scan_setup(ctx, inputs, out)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor, dlast: Tensor, _ds: Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _scan_grads(ctx, _scan_bwd_impl, dout, dlast)


def selective_scan_fn(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """`flashscan.selective_scan_fn` as a differentiable torch op (same arguments).

    Gradients reach every tensor argument (u, delta, A, B, C, D, z, delta_bias,
    initial_state), also through the returned last state. When u requires grad on a GPU the
    forward keeps the state after every 256 steps so the backward recomputes only inside
    chunks. float64 tensors run the NumPy references."""
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: flashscan.torch takes torch tensors, got {type(t).__name__}")
    delta_softplus = _checks.flag("delta_softplus", delta_softplus)
    return_last_state = _checks.flag("return_last_state", return_last_state)
    save = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (u, delta, A, B, C, D, z, delta_bias, initial_state)
    )
    args = (u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, save)
    if torch.compiler.is_compiling():
        out, last, _saved = torch.ops.flashscan.selective_scan_fwd(*args)
    else:
        out, last, _saved = _SelectiveScan.apply(*args)
    return (out, last) if return_last_state else out


# The core ops' grad-requiring torch calls come here (they look these up, never import us).
_routes.register("flash_attn_func", flash_attn_func)
_routes.register("selective_scan_fn", selective_scan_fn)
