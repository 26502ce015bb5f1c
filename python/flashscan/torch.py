"""flashscan.torch: differentiable torch ops on flashscan's kernels.

    import flashscan.torch as fst
    out = fst.flash_attn_func(q, k, v, causal=True)          # q, k, v may require grad
    y = fst.selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus=True)
    loss.backward()                                         # flashscan's backward kernels

Each operation is a `torch.library` custom op (`torch.ops.flashscan.*`) with a fake (meta)
implementation and a registered autograd formula, so `torch.compile(fullgraph=True)` traces
through it without a graph break and `torch.autograd.gradcheck` can check it. In eager mode the
same functions run through a plain `torch.autograd.Function` instead (attention, varlen
attention, the scan, the SSD and, in `_torch_conv`, the conv1d): the custom-op dispatch costs
more host time than the kernels take at real-time shapes. The top-level
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
import os
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from . import (
    _backend,
    _checks,
    _routes,
    reference,
    reference_bwd,
    reference_ssd,
    reference_varlen,
)
from . import attention as _attention
from . import scan as _scan
from . import ssd as _ssd
from . import varlen as _varlen
from ._frameworks import CUDA, contiguous_strides, handler_of

__all__ = [
    "causal_conv1d_fn",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "mamba_chunk_scan_combined",
    "selective_scan_fn",
]

_native = _backend.native
_F64 = torch.float64
_F32 = torch.float32
_NO_DEVICES: frozenset[int] = frozenset()


# ---------------------------------------------------------------------------------------------
# Helpers: where a call runs, host copies, descriptors for `_native`
# ---------------------------------------------------------------------------------------------


def _on_gpu(t: Tensor, op: str, depth: int = 3) -> bool:
    """True when `t`'s call runs on the CUDA kernels; False for the references (CPU, float64,
    or a CUDA device the backend cannot serve: the fallback policy decides, and may raise;
    `depth` as `_backend.on_fallback`'s, counted from here)."""
    if not t.is_cuda or t.dtype == _F64:
        return False
    dev = t.get_device()
    if dev in _backend.usable_devices():
        return True
    _backend.on_fallback(op, _backend.device_reason(dev), depth=depth)
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
    return _attn_fwd_general(q, k, v, softmax_scale, window_left, window_right, softcap, None)


def _attn_fwd_general(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    key: Any,
) -> tuple[Tensor, Tensor]:
    """The forward's general path: every check; float64 -> the reference. With `key` (the
    call's `attention_key`), a call served on the GPU records the API's plan for it."""
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
            lse_dtype=np.dtype(np.float64),  # merged exactly by flashscan.distributed
        )
        return _from_host(o, q), _from_host(lse, q)
    # The API's general path (not `flash_attn_func`, which would send a grad-requiring call
    # back here).
    return _attention._flash_attn_any(  # type: ignore[return-value]
        q, k, v, softmax_scale, False, window, softcap, True, None, key, route=False
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
    return _attention_grads(
        "flash_attn_bwd",
        reference_bwd.flash_attn_bwd,
        (dout, q, k, v, out, lse),
        (softmax_scale, window_left, window_right, softcap, deterministic),
    )


def _attention_grads(
    op: str,
    reference_fn: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]],
    tensors: tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor],
    options: tuple[float, int, int, float, bool],
    cu_seqlens: tuple[Tensor, Tensor] | tuple[()] = (),
    max_seqlens: tuple[int, int] | tuple[()] = (),
) -> tuple[Tensor, Tensor, Tensor]:
    """The attention backward, dense or packed: (dq, dk, dv) from tensors (dout, q, k, v, out,
    lse) and options (softmax_scale, window_left, window_right, softcap, deterministic). On the
    GPU `_native.<op>` (the varlen one also takes cu_seqlens and max_seqlens); on the host
    `reference_fn` (the varlen one also takes cu_seqlens)."""
    dout, q, k, v, out, lse = tensors
    scale, wl, wr, cap, deterministic = options
    if _on_gpu(q, op, depth=4):
        dout = _dense(dout)
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        cu = [_desc(t, name) for t, name in zip(cu_seqlens, ("cu_seqlens_q", "cu_seqlens_k"))]
        getattr(_native, op)(
            _desc(dout, "dout"),
            _desc(q, "q"),
            _desc(k, "k"),
            _desc(v, "v"),
            _desc(out, "out"),
            _desc(lse, "lse"),
            _desc(dq, "dq"),
            _desc(dk, "dk"),
            _desc(dv, "dv"),
            *cu,
            *max_seqlens,
            scale,
            wl,
            wr,
            cap,
            deterministic,
            _stream(q),
        )
        return dq, dk, dv
    acc = np.dtype(np.float64 if q.dtype == _F64 else np.float32)
    gq, gk, gv = reference_fn(
        *(_host(t) for t in tensors),
        *(_host(t) for t in cu_seqlens),
        softmax_scale=scale,
        window_size=(wl, wr),
        softcap=cap,
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


# The eager path: a lean autograd.Function. The custom-op dispatch above costs ~70 us of host
# time per op call on the lent H100's host (torch 2.11), more than the kernels at real-time
# shapes; torch.compile traces the custom ops instead. The first call of a signature runs the
# general path (every check; the references for CPU and float64 tensors; the fallback) and,
# when it was served on the GPU, records a lean plan: later calls of that signature allocate
# their outputs and call `_native` with descriptor tuples directly, forward and backward.

# attention signature (`attention_key`) -> (the API's plan, contiguous strides of k, of v);
# bounded like the API's plans. `_ATTN_LAST`: the last pair found (no hashing in a run).
_ATTN_LEAN: dict[Any, tuple[Any, ...]] = {}
_ATTN_LAST: tuple[Any, Any] = (None, None)


def _attn_lean_plan(key: Any) -> tuple[Any, ...] | None:
    """The lean plan of an attention signature, if it was served on a still usable device."""
    global _ATTN_LAST
    if key is None:
        return None
    seen = _ATTN_LAST
    if key == seen[0]:
        lean = seen[1]
    else:
        lean = _ATTN_LEAN.get(key)
        if lean is None:
            return None
        _ATTN_LAST = (key, lean)
    return lean if lean[0][0] in (_backend._usable or _NO_DEVICES) else None


def _attn_record(key: Any) -> tuple[Any, ...] | None:
    """After the general path: the lean plan of `key` when that call went to the GPU (the
    API recorded its plan), else None."""
    plan = None if key is None else _attention._PLANS.get(key)
    if plan is None:
        return None
    lean = (plan, contiguous_strides(key[4]), contiguous_strides(key[8]))
    _checks.remember(_ATTN_LEAN, key, lean)
    return lean


def _dense_desc(t: Tensor, dtype: str, dev: int) -> tuple[Tensor, tuple[Any, ...]]:
    """`_dense(t)` and its descriptor (t's dtype is `dtype`, on CUDA device `dev`)."""
    st = t.stride()
    if st[-1] != 1 or min(st) <= 0 or t.data_ptr() % 16:
        t = t.contiguous()
        st = t.stride()
    return t, (t.data_ptr(), t.shape, st, dtype, CUDA, dev)


def _attn_bwd_lean(
    ctx: Any, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The backward on a lean plan; None when the saved tensors no longer match the forward's
    signature or the device is no longer usable (the general backward then runs)."""
    key = ctx.key
    plan, ks, vs = ctx.lean
    dev, dts, _, o_shape, o_strides, l_shape, l_strides, stream, f32 = plan
    if (
        dev not in (_backend._usable or _NO_DEVICES)
        or _attention.attention_key(q, k, v) != key
        or out.shape != o_shape
        or out.stride() != o_strides
        or out.dtype is not key[2]
        or out.device != key[3]
        or dout.dtype is not key[2]
        or dout.shape != o_shape
        or (
            ctx.lse_out
            and (lse.shape != l_shape or lse.stride() != l_strides or lse.dtype is not f32)
        )
    ):
        return None
    dout, d_dout = _dense_desc(dout, dts, dev)
    dq = q.new_empty_strided(o_shape, o_strides)
    dk = k.new_empty_strided(key[4], ks)
    dv = v.new_empty_strided(key[8], vs)
    scale, wl, wr, cap, det = ctx.args
    _native.flash_attn_bwd(  # type: ignore[union-attr]
        d_dout,
        (q.data_ptr(), key[0], key[1], dts, CUDA, dev),
        (k.data_ptr(), key[4], key[5], dts, CUDA, dev),
        (v.data_ptr(), key[8], key[9], dts, CUDA, dev),
        (out.data_ptr(), o_shape, o_strides, dts, CUDA, dev),
        (lse.data_ptr(), l_shape, l_strides, "float32", CUDA, dev),
        (dq.data_ptr(), o_shape, o_strides, dts, CUDA, dev),
        (dk.data_ptr(), key[4], ks, dts, CUDA, dev),
        (dv.data_ptr(), key[8], vs, dts, CUDA, dev),
        scale,
        wl,
        wr,
        cap,
        det,
        stream(dev),
    )
    return dq, dk, dv


class _FlashAttn(torch.autograd.Function):
    """The eager path of the attention (see above): the lean plan, or the general path on a
    signature's first call, off the GPU and for float64. Returns out, or (out, lse) with
    `return_lse` (lse not differentiable). Grads that nothing uses are not materialised."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: float,
        wl: int,
        wr: int,
        cap: float,
        det: bool,
        return_lse: bool,
    ) -> Any:
        ctx.set_materialize_grads(False)
        key = _attention.attention_key(q, k, v)
        lean = _attn_lean_plan(key)
        if lean is None:
            out, lse = _attn_fwd_general(q, k, v, scale, wl, wr, cap, key)
            lean = _attn_record(key)
        else:
            out, lse = _attention.serve_attention(lean[0], key, q, k, v, scale, wl, wr, cap)
        ctx.key = key
        ctx.lean = lean
        ctx.args = (scale, wl, wr, cap, det)
        ctx.lse_out = return_lse
        if return_lse:
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.mark_non_differentiable(lse)
            return out, lse
        ctx.save_for_backward(q, k, v, out)
        ctx.lse = lse  # never seen by the caller: no version check needed
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor | None, *_dlse: Any) -> tuple[Any, ...]:  # type: ignore[override]
        if dout is None:
            return (None,) * 9
        saved = ctx.saved_tensors
        q, k, v, out = saved[:4]
        lse = saved[4] if ctx.lse_out else ctx.lse
        grads = None
        if ctx.lean is not None:
            grads = _attn_bwd_lean(ctx, dout, q, k, v, out, lse)
        if grads is None:
            grads = _attn_bwd_impl(dout, q, k, v, out, lse, *ctx.args)
        need = ctx.needs_input_grad
        dq, dk, dv = grads
        return (
            dq if need[0] else None,
            dk if need[1] else None,
            dv if need[2] else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


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
    scale, wl, wr, cap, causal, return_lse = _checks.attention_options(
        q.shape[-1], causal, window_size, softmax_scale, softcap, return_lse
    )
    deterministic = _checks.flag("deterministic", deterministic)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flashscan.flash_attn_fwd(q, k, v, scale, wl, wr, cap, deterministic)
        return (out, lse) if return_lse else out
    if q.dtype != _F64 and not (
        torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        # nothing to differentiate: the core call and its per-signature plans, without the
        # autograd Function's cost (as mamba_chunk_scan_combined below)
        return _attention.flash_attn_func(  # type: ignore[no-any-return]
            q, k, v, scale, causal, (wl, wr), cap, return_lse
        )
    return _FlashAttn.apply(q, k, v, scale, wl, wr, cap, deterministic, return_lse)


# ---------------------------------------------------------------------------------------------
# Attention over packed sequences (varlen)
# ---------------------------------------------------------------------------------------------


def _varlen_fwd_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    """(out, lse (nheads, total_q)); `deterministic` is only read by the backward."""
    window = (window_left, window_right)
    if q.dtype == _F64:
        o, lse = reference_varlen.flash_attn_varlen_func(
            _host(q),
            _host(k),
            _host(v),
            _host(cu_seqlens_q),
            _host(cu_seqlens_k),
            softmax_scale=softmax_scale,
            window_size=window,
            softcap=softcap,
            return_lse=True,
            accum_dtype=np.dtype(np.float64),
        )
        return _from_host(o, q), _from_host(lse, q)
    return _varlen.varlen_any(  # type: ignore[return-value]
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        False,
        window,
        softcap,
        True,
        None,
        route=False,
    )


_varlen_fwd = torch.library.custom_op(
    "flashscan::flash_attn_varlen_fwd", _varlen_fwd_impl, mutates_args=()
)


@_varlen_fwd.register_fake
def _varlen_fwd_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    total_q, h, _ = q.shape
    lse_dtype = _F64 if q.dtype == _F64 else _F32
    return q.new_empty(q.shape), q.new_empty((h, total_q), dtype=lse_dtype)


def _varlen_bwd_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the packed attention."""
    if q.shape[0] == 0 or k.shape[0] == 0 or len(cu_seqlens_q) < 2:
        # nothing attends (the forward ran the reference): every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    return _attention_grads(
        "flash_attn_varlen_bwd",
        reference_varlen.flash_attn_varlen_bwd,
        (dout, q, k, v, out, lse),
        (softmax_scale, window_left, window_right, softcap, deterministic),
        (cu_seqlens_q, cu_seqlens_k),
        (max_seqlen_q, max_seqlen_k),
    )


_varlen_bwd = torch.library.custom_op(
    "flashscan::flash_attn_varlen_bwd", _varlen_bwd_impl, mutates_args=()
)


@_varlen_bwd.register_fake
def _varlen_bwd_fake(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, cap, det = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, wl, wr, cap, det)
    ctx.mark_non_differentiable(lse)


def _varlen_grad(ctx: Any, dout: Tensor, _dlse: Tensor) -> tuple[Any, ...]:
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashscan.flash_attn_varlen_bwd(
        dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args
    )
    return (dq, dk, dv) + (None,) * 9


_varlen_fwd.register_autograd(_varlen_grad, setup_context=_varlen_setup)


class _FlashAttnVarlen(torch.autograd.Function):
    """The eager path of the packed attention (see `_FlashAttn`): the custom ops'
    implementations without their dispatch."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, *args: Any
    ) -> Any:  # type: ignore[override]
        ctx.set_materialize_grads(False)
        out, lse = _varlen_fwd_impl(q, k, v, cu_q, cu_k, *args)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = args
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: Tensor | None, _dlse: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        if dout is None:
            return (None,) * 12
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _varlen_bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
        need = ctx.needs_input_grad
        return (
            dq if need[0] else None,
            dk if need[1] else None,
            dv if need[2] else None,
        ) + (None,) * 9


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """`flashscan.flash_attn_varlen_func` as a differentiable torch op (same arguments and
    layout). Gradients reach q, k and v (dk, dv summed over each GQA group); cu_seqlens and
    the lse get none. `deterministic=True` makes the backward bit-reproducible. float64
    tensors run the NumPy references."""
    for name, t in (("q", q), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: flashscan.torch takes torch tensors, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(
            "q: expected a 3-D array (total_q, nheads, headdim), got shape "
            f"{_checks.fmt_shape(tuple(q.shape))} ({q.dim()}-D)"
        )
    scale, wl, wr, cap, causal, return_lse = _checks.attention_options(
        q.shape[-1], causal, window_size, softmax_scale, softcap, return_lse
    )
    deterministic = _checks.flag("deterministic", deterministic)
    max_q = _checks.nonnegative_int("max_seqlen_q", max_seqlen_q)
    max_k = _checks.nonnegative_int("max_seqlen_k", max_seqlen_k)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, wl, wr, cap, deterministic)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flashscan.flash_attn_varlen_fwd(*args)
    else:
        out, lse = _FlashAttnVarlen.apply(*args)
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
        # dB / dC in B's / C's dtype (a 16-bit one is summed in float32 scratch, rounded once)
        db = B.new_empty(B.shape)
        dc = C.new_empty(C.shape)
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


# scan signature (`scan.scan_key`) -> (the API's plan, nsaved, the saved states' shape and
# contiguous strides, contiguous strides of A, B, C); bounded. `_SCAN_LAST` as `_ATTN_LAST`.
_SCAN_LEAN: dict[Any, tuple[Any, ...]] = {}
_SCAN_LAST: tuple[Any, Any] = (None, None)


def _scan_lean_plan(key: Any) -> tuple[Any, ...] | None:
    """The lean plan of a scan signature, if it was served on a still usable device."""
    global _SCAN_LAST
    if key is None:
        return None
    seen = _SCAN_LAST
    if key == seen[0]:
        lean = seen[1]
    else:
        lean = _SCAN_LEAN.get(key)
        if lean is None:
            return None
        _SCAN_LAST = (key, lean)
    return lean if lean[0][0] in (_backend._usable or _NO_DEVICES) else None


def _scan_record(key: Any) -> tuple[Any, ...] | None:
    """After the general path: the lean plan of `key` when that call went to the GPU."""
    plan = None if key is None else _scan._SCAN_PLANS.get(key)
    if plan is None:
        return None
    batch, dim, seqlen = plan[4]
    nsaved = _saved_count(seqlen)
    s_shape = (batch, dim, nsaved, key[8][-1])
    lean = (
        plan,
        nsaved,
        s_shape,
        contiguous_strides(s_shape),
        contiguous_strides(key[8]),
        contiguous_strides(key[12]),
        contiguous_strides(key[16]),
    )
    _checks.remember(_SCAN_LEAN, key, lean)
    return lean


def _scan_fwd_general(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    initial_state: Tensor | None,
    delta_softplus: bool,
    save: bool,
    return_last: bool,
    key: Any,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The eager forward's general path: every check; float64 -> the reference. Returns (out,
    last state or None, saved states or None); saved states only when `save`, on a usable
    GPU, with at least one chunk to save. With `key` (the call's `scan_key`), a call served
    on the GPU records the API's plan for it."""
    if u.dtype == _F64:
        out, last, _ = _scan_fwd_impl(
            u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, False
        )
        return out, (last if return_last else None), None
    saved = None
    if save and u.is_cuda and u.dim() == 3 and A.dim() == 2:
        nsaved = _saved_count(u.shape[2])
        if nsaved > 0 and u.get_device() in _backend.usable_devices():
            shape = (u.shape[0], u.shape[1], nsaved, A.shape[-1])
            saved = u.new_empty(shape, dtype=_F32)  # the forward kernel fills it
    res = _scan._scan_any(
        u,
        delta,
        A,
        B,
        C,
        D,
        z,
        delta_bias,
        delta_softplus,
        return_last,
        initial_state,
        key,
        route=False,
        saved_states=saved,
    )
    if return_last:
        return res[0], res[1], saved
    return res, None, saved


def _scan_bwd_lean(
    ctx: Any,
    dout: Tensor,
    dlast: Tensor | None,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    init: Tensor | None,
) -> tuple[Any, ...] | None:
    """The backward on a lean plan: (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias,
    dinitial_state) in the inputs' dtypes (None for an absent input); None when the saved
    tensors no longer match the forward's signature or the device is no longer usable."""
    key = ctx.key
    plan, _, s_shape, s_strides, a_st, b_st, c_st = ctx.lean
    dev, dts, dtb, dtc, o_shape, o_strides, l_shape, l_strides, stream, f32, replays = plan
    if (
        dev not in (_backend._usable or _NO_DEVICES)
        or _scan.scan_key(u, delta, A, B, C, D, z, delta_bias, init) != key
        or dout.dtype is not key[2]
        or dout.shape != o_shape
    ):
        return None
    dout, d_dout = _dense_desc(dout, dts, dev)
    d_dlast = None
    if dlast is not None:
        if dlast.dtype is not f32:
            dlast = dlast.to(f32)
        dlast, d_dlast = _dense_desc(dlast, "float32", dev)
    saved = ctx.saved_states
    # the kernels write every element of du, ddelta, dz, dinitial_state and zero the summed
    # gradients (dA, dB, dC, dD, ddelta_bias) themselves: no allocation is zero-filled. dB / dC
    # come in B's / C's dtype (a 16-bit one is summed in float32 scratch and rounded once)
    mD, mz, mdb, minit = key[20], key[21], key[22], key[23]
    du = u.new_empty_strided(o_shape, o_strides)
    ddelta = u.new_empty_strided(o_shape, o_strides)
    da = u.new_empty_strided(key[8], a_st, dtype=f32)
    db = u.new_empty_strided(key[12], b_st, dtype=key[14])
    dc = u.new_empty_strided(key[16], c_st, dtype=key[18])
    dd = None if mD is None else u.new_empty_strided(mD[0], (1,), dtype=f32)
    # z has u's shape (checked by the forward); dinitial_state the last state's
    dz = None if mz is None else u.new_empty_strided(o_shape, o_strides)
    ddb = None if mdb is None else u.new_empty_strided(mdb[0], (1,), dtype=f32)
    dinit = None if minit is None else u.new_empty_strided(l_shape, l_strides, dtype=f32)
    grads = (du, ddelta, da, db, dc, dd, dz, ddb, dinit)
    # after the first call with these flags and dout / dlast strides: the replay plan (raw
    # pointers, no descriptors, no checks; the signature was checked when it was planned)
    rk = (1, d_dout[2], None if d_dlast is None else d_dlast[2], saved is None, ctx.delta_softplus)
    replay = replays.get(rk)
    if replay:
        replay.launch(
            *_scan.input_ptrs(u, delta, A, B, C, D, z, delta_bias, init),
            d_dout[0],
            0 if saved is None else saved.data_ptr(),
            0 if d_dlast is None else d_dlast[0],
            *(0 if g is None else g.data_ptr() for g in grads),
            stream(dev),
        )
        return grads

    def opt(t: Tensor | None, m: Any, dtype: str) -> Any:  # an optional input's descriptor
        return None if t is None else (t.data_ptr(), m[0], m[1], dtype, CUDA, dev)

    def opt_out(t: Tensor | None, shape: Any, strides: Any) -> Any:  # an optional gradient's
        return None if t is None else (t.data_ptr(), shape, strides, str(t.dtype)[6:], CUDA, dev)

    descs = (
        (u.data_ptr(), key[0], key[1], dts, CUDA, dev),
        (delta.data_ptr(), key[4], key[5], dts, CUDA, dev),
        (A.data_ptr(), key[8], key[9], "float32", CUDA, dev),
        (B.data_ptr(), key[12], key[13], dtb, CUDA, dev),
        (C.data_ptr(), key[16], key[17], dtc, CUDA, dev),
        opt(D, mD, "float32"),
        opt(z, mz, dts),
        opt(delta_bias, mdb, "float32"),
        opt(init, minit, "float32"),
        d_dout,
        None if saved is None else (saved.data_ptr(), s_shape, s_strides, "float32", CUDA, dev),
        d_dlast,
        (du.data_ptr(), o_shape, o_strides, dts, CUDA, dev),
        (ddelta.data_ptr(), o_shape, o_strides, dts, CUDA, dev),
        (da.data_ptr(), key[8], a_st, "float32", CUDA, dev),
        (db.data_ptr(), key[12], b_st, dtb, CUDA, dev),
        (dc.data_ptr(), key[16], c_st, dtc, CUDA, dev),
        opt_out(dd, None if mD is None else mD[0], (1,)),
        opt_out(dz, o_shape, o_strides),
        opt_out(ddb, None if mdb is None else mdb[0], (1,)),
        opt_out(dinit, l_shape, l_strides),
        ctx.delta_softplus,
    )
    if replay is None and len(replays) < _scan.REPLAYS_PER_PLAN:
        # plan the replay (checked, nothing launched; False: an empty problem)
        replays[rk] = _native.selective_scan_bwd(*descs, None, replay=True) or False  # type: ignore[union-attr]
    _native.selective_scan_bwd(*descs, stream(dev))  # type: ignore[union-attr]
    return grads


class _SelectiveScan(torch.autograd.Function):
    """The eager path of the scan (see `_FlashAttn`). Returns out, or (out, last_state) with
    `return_last`; the states saved for the backward stay on ctx (never an output)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor | None,
        z: Tensor | None,
        delta_bias: Tensor | None,
        initial_state: Tensor | None,
        delta_softplus: bool,
        save: bool,
        return_last: bool,
    ) -> Any:
        ctx.set_materialize_grads(False)
        key = _scan.scan_key(u, delta, A, B, C, D, z, delta_bias, initial_state)
        lean = _scan_lean_plan(key)
        if lean is None:
            out, last, saved = _scan_fwd_general(
                u,
                delta,
                A,
                B,
                C,
                D,
                z,
                delta_bias,
                initial_state,
                delta_softplus,
                save,
                return_last,
                key,
            )
            lean = _scan_record(key)
        else:
            saved = d_saved = None
            if save and lean[1]:
                s_shape, s_strides = lean[2], lean[3]
                saved = u.new_empty_strided(s_shape, s_strides, dtype=_F32)
                d_saved = (saved.data_ptr(), s_shape, s_strides, "float32", CUDA, lean[0][0])
            out, last = _scan.serve_scan(
                lean[0],
                key,
                u,
                delta,
                A,
                B,
                C,
                D,
                z,
                delta_bias,
                initial_state,
                delta_softplus,
                return_last,
                d_saved,
            )
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, initial_state)
        ctx.saved_states = saved  # ours alone (not an output): no version check needed
        ctx.key = key
        ctx.lean = lean
        ctx.delta_softplus = delta_softplus
        return (out, last) if return_last else out

    @staticmethod
    def backward(ctx: Any, dout: Tensor | None, dlast: Tensor | None = None) -> tuple[Any, ...]:  # type: ignore[override]
        if dout is None and dlast is None:
            return (None,) * 12
        u, delta, A, B, C, D, z, delta_bias, init = ctx.saved_tensors
        if dout is None:  # only the last state reaches the loss
            dout = u.new_zeros(u.shape)
        grads = None
        if ctx.lean is not None:
            grads = _scan_bwd_lean(ctx, dout, dlast, u, delta, A, B, C, D, z, delta_bias, init)
        if grads is None:
            saved = ctx.saved_states
            grads = _scan_bwd_impl(
                dout,
                dlast,
                u,
                delta,
                A,
                B,
                C,
                D,
                z,
                delta_bias,
                init,
                _absent(u) if saved is None else saved,
                ctx.delta_softplus,
            )
        need = ctx.needs_input_grad
        inputs = (u, delta, A, B, C, D, z, delta_bias, init)
        return tuple(g if n and t is not None else None for g, n, t in zip(grads, need, inputs)) + (
            None,
            None,
            None,
        )


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
    serve = _scan._SERVE
    if serve is not None and not torch.compiler.is_compiling():
        # a planned signature with nothing to differentiate, in one native call (None: not one
        # the core's server serves, e.g. an input requiring grad)
        r = serve(
            u,
            delta,
            A,
            B,
            C,
            D,
            z,
            delta_bias,
            initial_state,
            delta_softplus,
            return_last_state,
            False,
        )
        if r is not None:
            return r  # type: ignore[no-any-return]
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
        return (out, last) if return_last_state else out
    if not save and u.dtype != _F64:
        # nothing to differentiate: the core call (its native server from a signature's
        # second call), without the autograd Function's cost
        return _scan.selective_scan_fn(  # type: ignore[no-any-return]
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state
        )
    return _SelectiveScan.apply(*args, return_last_state)


# The core ops' grad-requiring torch calls come here (they look these up, never import us).
_routes.register("flash_attn_func", flash_attn_func)
_routes.register("flash_attn_varlen_func", flash_attn_varlen_func)
_routes.register("selective_scan_fn", selective_scan_fn)

# The causal conv1d's ops live in their own module, which registers its route itself.
from ._torch_conv import causal_conv1d_fn  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Mamba-2 SSD chunked scan (mamba_chunk_scan_combined)
# ---------------------------------------------------------------------------------------------

_SSD_FLOATS = (*_checks.FLOAT_DTYPES, "float64")
_SSD_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def _ssd_fwd_impl(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Optional[Tensor],  # noqa: UP045 - torch.library parses the annotation
    z: Optional[Tensor],  # noqa: UP045
    dt_bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, final_states, kept 16-bit H_c, kept chunk decays) through the API's general path
    (GPU, or the reference on host); the last two are empty (0,) tensors unless `_op_keeps`
    (then the backward op reads them instead of recomputing the states)."""
    keep: list[Any] | None = [] if _op_keeps(x, z) else None
    out, final, _ = _ssd.ssd_any(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, None, dt_softplus,
        (dt_min, dt_max), True, False, floats=_SSD_FLOATS, keep=keep,
    )  # fmt: skip
    if keep:
        return out, final, *keep[0]
    if keep is not None:  # (_op_keeps holds, so the fake impl promised the kept shapes)
        raise RuntimeError("mamba_chunk_scan_fwd: the GPU forward kept no states (internal)")
    return out, final, _absent(x), _absent(x)


_ssd_fwd = torch.library.custom_op(
    "flashscan::mamba_chunk_scan_fwd", _ssd_fwd_impl, mutates_args=()
)


@_ssd_fwd.register_fake
def _ssd_fwd_fake(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Optional[Tensor],  # noqa: UP045
    z: Optional[Tensor],  # noqa: UP045
    dt_bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    acc = _F64 if x.dtype == _F64 else _F32
    out = x.new_empty(x.shape)
    final = x.new_empty((batch, nheads, headdim, B.shape[-1]), dtype=acc)
    if _op_keeps(x, z):
        nchunks = -(-seqlen // chunk_size)
        h16 = x.new_empty((batch, nchunks, nheads, headdim, B.shape[-1]))
        return out, final, h16, x.new_empty((batch, nheads, nchunks), dtype=_F32)
    return out, final, _absent(x), _absent(x)


def _ssd_bwd_impl(
    dout: Tensor,
    dfinal_states: Optional[Tensor],  # noqa: UP045
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Optional[Tensor],  # noqa: UP045
    z: Optional[Tensor],  # noqa: UP045
    dt_bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
    kept_states16: Optional[Tensor] = None,  # noqa: UP045
    kept_decay: Optional[Tensor] = None,  # noqa: UP045
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states), each in its input's dtype;
    an absent input's gradient is an empty (0,) tensor. CUDA tensors (not float64, not empty)
    run the backward kernels (`_native.ssd_bwd`, the forward recomputed inside); float64, CPU
    and empty calls the NumPy reference on the host."""
    kept = None
    if kept_states16 is not None and kept_decay is not None and kept_states16.numel() > 0:
        kept = (kept_states16, kept_decay)  # the forward op's (empty where it kept none)
    return _ssd_bwd_run(
        dout, dfinal_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
        dt_softplus, dt_min, dt_max, kept,
    )  # fmt: skip


def _ssd_bwd_run(
    dout: Tensor,
    dfinal_states: Tensor | None,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None,
    z: Tensor | None,
    dt_bias: Tensor | None,
    initial_states: Tensor | None,
    seq_idx: Tensor | None,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
    kept: tuple[Tensor, Tensor] | None,
) -> tuple[Tensor, ...]:
    """`_ssd_bwd_impl`'s body; `kept`: the forward's (16-bit H_c, chunk decays) when it kept
    them (`_keeps_states`), which a 16-bit call's kernels then read instead of recomputing."""
    likes = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    if x.numel() > 0 and _on_gpu(x, "mamba_chunk_scan_combined_bwd"):
        # A 16-bit call without z runs on its own tensors (the 16-bit kernels, cuda/ssd_bwd.cu
        # 8f-8i: the chunk states and C B^T recomputed on ssd2's kernels, every gradient written
        # once in its input's dtype). One with z (or FLASHSCAN_SSD_DX16=0, or the first path)
        # runs the float32 kernels on float32 copies of x, B, C, z and dout, and dx, dB, dC, dz
        # are cast back: with z the 16-bit kernels' g = dout silu(z) would be rounded to 16 bits
        # (an fp16 ddt_bias at 1.1x its limit, 2026-11-27). dt, A, D, dt_bias and the states
        # keep their dtypes: every kernel reads those in any float dtype.
        tf32 = x.dtype in (torch.float16, torch.bfloat16)
        sixteen = tf32 and _native.ssd_bwd_16bit(z is not None)  # type: ignore[union-attr]
        if sixteen:
            tf32 = False  # no copies: the 16-bit kernels read the call's tensors (their rows)
            x, B, C = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, B, C))
        elif tf32:
            x, B, C, dout = x.float(), B.float(), C.float(), dout.float()
            z = None if z is None else z.float()
        kernel_in = (x, dt, A, B, C, D, z, dt_bias, initial_states)
        grads = tuple(None if t is None else t.new_empty(t.shape) for t in kernel_in)
        dout = _dense(dout)
        dfin = None if dfinal_states is None else _dense(dfinal_states)
        seq = None if seq_idx is None or seq_idx.dtype == torch.int32 else seq_idx.int()
        _native.ssd_bwd(  # type: ignore[union-attr]
            *(_desc(t, n) for t, n in zip(kernel_in, _SSD_NAMES)),
            _desc(seq_idx if seq is None else seq, "seq_idx"),
            _desc(dout, "dout"),
            _desc(dfin, "dfinal_states"),
            *(_desc(g, "d" + n) for g, n in zip(grads, _SSD_NAMES)),
            chunk_size, dt_softplus, dt_min, dt_max, _stream(x), tf32,
            *(kept if sixteen and kept is not None else (None, None)),
        )  # fmt: skip
        return tuple(  # type: ignore[return-value]
            _absent(likes[0]) if g is None else (g if g.dtype == like.dtype else g.to(like.dtype))
            for g, like in zip(grads, likes)
        )
    host = reference_ssd.mamba_chunk_scan_combined_bwd(
        _host(dout), _host(x), _host(dt), _host(A), _host(B), _host(C), chunk_size,
        D=_host(D), z=_host(z), dt_bias=_host(dt_bias), initial_states=_host(initial_states),
        seq_idx=_host(seq_idx), dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max),
        dfinal_states=_host(dfinal_states),
    )  # fmt: skip
    return tuple(  # type: ignore[return-value]
        _absent(x) if g is None or like is None else _from_host(g, like)
        for g, like in zip(host, likes)
    )


_ssd_bwd = torch.library.custom_op(
    "flashscan::mamba_chunk_scan_bwd", _ssd_bwd_impl, mutates_args=()
)


@_ssd_bwd.register_fake
def _ssd_bwd_fake(
    dout: Tensor,
    dfinal_states: Optional[Tensor],  # noqa: UP045
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Optional[Tensor],  # noqa: UP045
    z: Optional[Tensor],  # noqa: UP045
    dt_bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
    kept_states16: Optional[Tensor] = None,  # noqa: UP045
    kept_decay: Optional[Tensor] = None,  # noqa: UP045
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    likes = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    return tuple(_absent(x) if t is None else t.new_empty(t.shape) for t in likes)  # type: ignore[return-value]


def _ssd_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x, dt, A, B, C, chunk, D, z, dt_bias, init, seq_idx, softplus, lo, hi = inputs
    # the kept H_c and decays (empty where the forward kept none) go to the backward op
    ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, init, seq_idx, output[2], output[3])
    ctx.mark_non_differentiable(output[2], output[3])
    ctx.options = (chunk, softplus, lo, hi)


def _ssd_grad(
    ctx: Any, dout: Tensor, dfinal: Tensor, _dh16: Any = None, _ddecay: Any = None
) -> tuple[Any, ...]:
    x, dt, A, B, C, D, z, dt_bias, init, seq_idx, h16, decay = ctx.saved_tensors
    chunk, softplus, lo, hi = ctx.options
    grads = torch.ops.flashscan.mamba_chunk_scan_bwd(
        dout, dfinal, x, dt, A, B, C, chunk, D, z, dt_bias, init, seq_idx, softplus, lo, hi,
        h16, decay,
    )  # fmt: skip
    present = (True,) * 5 + tuple(t is not None for t in (D, z, dt_bias, init))
    g = [gi if p else None for gi, p in zip(grads, present)]
    return (*g[:5], None, *g[5:], None, None, None, None)


_ssd_fwd.register_autograd(_ssd_grad, setup_context=_ssd_setup)


def _keeps_states(x: Tensor, z: Tensor | None) -> bool:
    """Whether an eager forward keeps its 16-bit H_c and chunk decays for the backward: a
    16-bit x without z on the GPU, whose backward runs the 16-bit kernels (they read H_c in
    x's dtype, the values the forward's scan read), unless FLASHSCAN_SSD_KEEP_STATES=0 (read
    per call). The price is memory until the backward: batch * nchunks * nheads * headdim *
    dstate 16-bit values (at b8 L2048 80 x 64, state 128: 84 MB, half of x's). What it saves:
    the backward's recompute of the chunk states and the state passing (H200, 2026-11-28:
    see benches/results/2026-11-28-h200-ssd-kept-states)."""
    return (
        x.dtype in (torch.float16, torch.bfloat16)
        and z is None
        and x.is_cuda
        and os.environ.get("FLASHSCAN_SSD_KEEP_STATES") != "0"
        and _native is not None
        and bool(_native.ssd_bwd_16bit(False))
    )


def _op_keeps(x: Tensor, z: Tensor | None) -> bool:
    """Whether the forward op (`flashscan::mamba_chunk_scan_fwd`, what torch.compile traces)
    keeps its states: `_keeps_states` on a call that the second GPU path serves (its real and
    fake impls both ask, so the kept outputs' shapes agree). The op always asks for the final
    states, so a served call has states to keep."""
    if not _keeps_states(x, z) or x.numel() == 0:
        return False
    name = "bfloat16" if x.dtype == torch.bfloat16 else "float16"
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _ssd._fwd2(name) and index in _backend.usable_devices()


class _MambaChunkScan(torch.autograd.Function):
    """The eager path of the SSD (see `_FlashAttn`): the same implementations as the custom
    ops without their dispatch; an output the loss does not use gets no materialised zeros
    (an unused final state is passed to the backward as None). `want_final` False: the final
    states are not computed (None; the backward recomputes what it needs), so a one-chunk call
    skips the chunk-state and state-passing launches."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        dt: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        chunk_size: int,
        D: Tensor | None,
        z: Tensor | None,
        dt_bias: Tensor | None,
        initial_states: Tensor | None,
        seq_idx: Tensor | None,
        dt_softplus: bool,
        dt_min: float,
        dt_max: float,
        want_final: bool,
    ) -> Any:
        ctx.set_materialize_grads(False)
        # a signature served on the GPU before takes the core's plan (no checks, one native
        # call); the first call of a signature takes every check and records that plan
        tensors = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
        key = _ssd._key(tensors, (chunk_size, dt_softplus, (dt_min, dt_max), want_final, False))
        plan = None if key is None else _ssd._PLANS.get(key)
        keep: list[Any] | None = [] if _keeps_states(x, z) else None
        if plan is not None and plan[0] in (_backend._usable or _NO_DEVICES):
            out, final = _ssd._serve(plan, tensors, keep)
        else:
            out, final, _ = _ssd.ssd_any(
                x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, None,
                dt_softplus, (dt_min, dt_max), want_final, False, floats=_SSD_FLOATS, key=key,
                keep=keep,
            )  # fmt: skip
        kept = keep[0] if keep else (None, None)
        ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, *kept)
        ctx.options = (chunk_size, dt_softplus, dt_min, dt_max)
        return out, final

    @staticmethod
    def backward(ctx: Any, dout: Tensor | None, dfinal: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        if dout is None and dfinal is None:
            return (None,) * 15
        x, dt, A, B, C, D, z, dt_bias, init, seq_idx, h16, decay = ctx.saved_tensors
        chunk, softplus, lo, hi = ctx.options
        if dout is None:  # only the final states reach the loss
            dout = torch.zeros_like(x)
        grads = _ssd_bwd_run(
            dout, dfinal, x, dt, A, B, C, chunk, D, z, dt_bias, init, seq_idx, softplus, lo, hi,
            None if h16 is None else (h16, decay),
        )  # fmt: skip
        need = ctx.needs_input_grad
        inputs = (x, dt, A, B, C, D, z, dt_bias, init)
        g = [gi if t is not None and need[i if i < 5 else i + 1] else None
             for i, (gi, t) in enumerate(zip(grads, inputs))]  # fmt: skip
        return (*g[:5], None, *g[5:], None, None, None, None, None)


def mamba_chunk_scan_combined(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Any:
    """`flashscan.mamba_chunk_scan_combined` as a differentiable torch op (same arguments).

    Gradients reach x, dt, A, B, C, D, z, dt_bias and initial_states, also through the
    returned final states; varlen_states carry no gradient (as in mamba_ssm, whose backward
    refuses them). float64 tensors run the NumPy reference (what gradcheck checks); CUDA
    tensors of the other dtypes run the SSD backward kernels."""
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: flashscan.torch takes torch tensors, got {type(t).__name__}")
    chunk_size = _checks.positive_int("chunk_size", chunk_size)
    dt_softplus = _checks.flag("dt_softplus", dt_softplus)
    lo, hi = _checks.dt_limit(dt_limit)
    return_final_states = _checks.flag("return_final_states", return_final_states)
    return_varlen_states = _checks.flag("return_varlen_states", return_varlen_states)
    grads = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    if (
        not torch.compiler.is_compiling()
        and x.dtype != _F64
        and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in grads))
    ):
        # nothing to differentiate: the core call and its per-signature plans (the autograd
        # Function cost ~100 us more per real-time call on the H100: 118.8 us eager vs 16.3 us
        # of GPU time at b32 L60)
        return _ssd.mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, (lo, hi), return_final_states, return_varlen_states,
        )  # fmt: skip
    args = (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus)
    if torch.compiler.is_compiling():
        out, final, _, _ = torch.ops.flashscan.mamba_chunk_scan_fwd(*args, lo, hi)
    else:
        out, final = _MambaChunkScan.apply(*args, lo, hi, return_final_states)
    result = [out]
    if return_final_states:
        result.append(final)
    if return_varlen_states:
        detached = [
            None if t is None else t.detach()
            for t in (x, dt, A, B, C, D, z, dt_bias, initial_states)
        ]
        _, _, varlen = _ssd.ssd_any(
            *detached[:5], chunk_size, *detached[5:], seq_idx, cu_seqlens, dt_softplus, (lo, hi),
            False, True, floats=_SSD_FLOATS,
        )  # fmt: skip
        result.append(varlen)
    return result[0] if len(result) == 1 else tuple(result)


_routes.register("mamba_chunk_scan_combined", mamba_chunk_scan_combined)
