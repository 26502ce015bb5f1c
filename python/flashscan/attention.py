"""`flash_attn_func`: flash-attn's forward, on the CUDA backend or the NumPy reference.

Dispatch: checks (`_checks.attention`), then
- CUDA arrays on a device the backend serves -> `_native.flash_attn_fwd` on the caller's
  current stream, outputs allocated in the caller's framework (or taken from `out=`);
- CPU arrays -> `reference.flash_attn_func`;
- CUDA arrays the backend cannot serve -> the fallback policy, then the reference on the host.

The CUDA path is the hot one (real-time callers make thousands of calls a second). For torch
tensors it is a plan lookup: the call's signature (each tensor's shape, strides, dtype and
device, as torch hands them out, plus out='s) keys a dict of plans that the general path
(`_flash_attn_any`) records after it has checked a call and sent it to the GPU, so a repeated
signature skips every check, handler and descriptor function: it reads each tensor once,
allocates with `Tensor.new_empty_strided` and calls `_native`. The plan holds no tensor and no
option: options are checked on every call, and the device must still be usable. Every other
call (other frameworks, CPU tensors, empty problems, the fallback, the first call of a
signature, bad input) takes the general path, which checks and raises as it always has.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _backend, _checks, _routes, reference
from ._frameworks import (
    _HANDLERS,
    CPU,
    CUDA,
    TORCH_TYPES,
    Desc,
    Handler,
    _resolve,
    finished,
    grad_enabled,
    needs_autograd,
    out_and_lse,
)
from .attention_fp8 import flash_attn_fp8, is_fp8

__all__ = ["flash_attn_func"]

_native = _backend.native
_usable_devices = _backend.usable_devices
_INF = math.inf
_NO_WINDOW = _checks.NO_WINDOW  # the default: `is` finds it without comparing
_NO_DEVICES: frozenset[int] = frozenset()

# signature -> plan (see `_plan`); bounded like the check memos. `_LAST` is the last (signature,
# plan) pair found there: comparing with it first skips hashing the signature (~0.4 us) in
# the usual run of same-signature calls. Both are replaced whole, never mutated: thread-safe.
_PLANS: dict[Any, tuple[Any, ...]] = {}
_LAST: tuple[Any, Any] = (None, None)


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = _NO_WINDOW,
    softcap: float = 0.0,
    return_lse: bool = False,
    out: Any = None,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> Any | tuple[Any, Any]:
    """Scaled dot-product attention forward, flash-attn's `flash_attn_func`.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), with
    nheads % nheads_k == 0 (GQA/MQA); float16, bfloat16 or float32 (one dtype for all);
    headdim a multiple of 8 up to 256; the last dimension contiguous. Any seqlen >= 0.

    softmax_scale: default 1/sqrt(headdim). causal / window_size=(left, right): masks aligned
    bottom-right as in flash-attn >= 2.1 (query i sees key j iff
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right; -1 is unbounded;
    causal sets right = 0). softcap > 0 caps scores as softcap * tanh(score / softcap).
    A query that sees no key gets output 0 (and lse -inf).

    Returns out (like q; written into `out` when given) and, with return_lse=True,
    (out, lse) where lse is (batch, nheads, seqlen_q) float32. Arrays come back in q's
    framework on q's device; CUDA work runs on the caller's current stream.

    FP8 (flash-attn 3's form): torch.float8_e4m3fn q, k, v with optional float32 descales of
    shape (batch, nheads_k) (`q_descale`, `k_descale`, `v_descale`) give a bfloat16 out; the
    e4m3 tensor-core kernel on Hopper, else dequantised inputs on the 16-bit path
    (`flashscan.attention_fp8`).
    """
    global _LAST
    key = attention_key(q, k, v, out)
    if key is not None:
        seen = _LAST
        if key == seen[0]:
            plan = seen[1]
        else:
            plan = _PLANS.get(key)
            if plan is not None:
                _LAST = (key, plan)
        if (
            plan is not None
            and q_descale is None
            and k_descale is None
            and v_descale is None
            and plan[0] in (_backend._usable or _NO_DEVICES)
            and not ((q.requires_grad or k.requires_grad or v.requires_grad) and grad_enabled())
        ):
            # --- the hot path: a signature already checked and served -------------------------
            # the options: `_checks.attention_options` inline (a call costs more than these
            # lines take for plain values)
            dev, dts, d_scale, o_shape, o_strides, l_shape, l_strides, stream, f32 = plan
            if causal is not False and causal is not True:
                causal = _checks.flag("causal", causal)
            if return_lse is not False and return_lse is not True:
                return_lse = _checks.flag("return_lse", return_lse)
            if window_size is _NO_WINDOW or (
                type(window_size) is tuple and window_size == _NO_WINDOW
            ):
                wl, wr = -1, (0 if causal else -1)
            else:
                wl, wr = _checks.window(window_size, causal)
            if softmax_scale is None:
                scale = d_scale
            elif type(softmax_scale) is float and -_INF < softmax_scale < _INF:
                scale = softmax_scale
            else:
                scale = _checks.real("softmax_scale", softmax_scale)
            if type(softcap) is float and 0.0 <= softcap < _INF:
                cap = softcap
            else:
                cap = _checks.real("softcap", softcap, minimum=0.0)
            if out is None:
                out = q.new_empty_strided(o_shape, o_strides)
                oa = (out.data_ptr(), o_shape, o_strides, dts, CUDA, dev)
            else:
                mo = key[12]
                oa = (out.data_ptr(), mo[0], mo[1], dts, CUDA, dev)
            if return_lse:
                lse = q.new_empty_strided(l_shape, l_strides, dtype=f32)
                la = (lse.data_ptr(), l_shape, l_strides, "float32", CUDA, dev)
            else:
                lse = la = None
            _native.flash_attn_fwd(  # type: ignore[union-attr]
                (q.data_ptr(), key[0], key[1], dts, CUDA, dev),
                (k.data_ptr(), key[4], key[5], dts, CUDA, dev),
                (v.data_ptr(), key[8], key[9], dts, CUDA, dev),
                oa,
                la,
                scale,
                wl,
                wr,
                cap,
                stream(dev),
            )
            return (out, lse) if return_lse else out
    if q_descale is not None or k_descale is not None or v_descale is not None or is_fp8(q):
        return flash_attn_fp8(
            q,
            k,
            v,
            softmax_scale,
            causal,
            window_size,
            softcap,
            return_lse,
            out,
            q_descale,
            k_descale,
            v_descale,
            flash_attn_func,
        )
    return _flash_attn_any(
        q, k, v, softmax_scale, causal, window_size, softcap, return_lse, out, key
    )


def attention_key(q: Any, k: Any, v: Any, out: Any = None) -> tuple[Any, ...] | None:
    """The signature of a call on torch tensors q, k, v (and out=, or None): each tensor's
    shape, strides, dtype and device, what `_PLANS` is keyed by; None when one is not a torch
    tensor or has no strides (the general path then says what is wrong). Used by the hot path
    here and by `flashscan.torch`'s eager path."""
    if not (
        type(q) in TORCH_TYPES
        and type(k) in TORCH_TYPES
        and type(v) in TORCH_TYPES
        and (out is None or type(out) in TORCH_TYPES)
    ):
        return None
    try:
        return (
            q.shape,
            q.stride(),
            q.dtype,
            q.device,
            k.shape,
            k.stride(),
            k.dtype,
            k.device,
            v.shape,
            v.stride(),
            v.dtype,
            v.device,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
        )
    except Exception:  # no strides (sparse, nested...): the general path says what is wrong
        return None


def serve_attention(
    plan: tuple[Any, ...],
    key: tuple[Any, ...],
    q: Any,
    k: Any,
    v: Any,
    scale: float,
    wl: int,
    wr: int,
    cap: float,
) -> tuple[Any, Any]:
    """The hot path's work for torch tensors of signature `key` (no out=) with its `plan`
    (checked and served before, on a usable device; options already checked): allocate out
    and lse, call `_native.flash_attn_fwd` with descriptor tuples on the current stream.
    Returns (out, lse)."""
    dev, dts, _, o_shape, o_strides, l_shape, l_strides, stream, f32 = plan
    out = q.new_empty_strided(o_shape, o_strides)
    lse = q.new_empty_strided(l_shape, l_strides, dtype=f32)
    _native.flash_attn_fwd(  # type: ignore[union-attr]
        (q.data_ptr(), key[0], key[1], dts, CUDA, dev),
        (k.data_ptr(), key[4], key[5], dts, CUDA, dev),
        (v.data_ptr(), key[8], key[9], dts, CUDA, dev),
        (out.data_ptr(), o_shape, o_strides, dts, CUDA, dev),
        (lse.data_ptr(), l_shape, l_strides, "float32", CUDA, dev),
        scale,
        wl,
        wr,
        cap,
        stream(dev),
    )
    return out, lse


def _plan(h: Any, dq: Desc, b: int, sq: int, nheads: int, d: int) -> tuple[Any, ...]:
    """What the hot path needs for a checked torch signature: the device, q's dtype name, the
    default scale, out's and lse's shapes and contiguous strides (what `new_empty` would give;
    every size is >= 1 here), the stream lookup and torch.float32. Cheap: a signature that
    never repeats (a growing seqlen_k) pays for it on every call."""
    return (
        dq[5],
        dq[3],
        1.0 / math.sqrt(d),
        (b, sq, nheads, d),
        (sq * nheads * d, nheads * d, d, 1),
        (b, nheads, sq),
        (nheads * sq, sq, 1),
        h.current_stream,
        h.float32,
    )


def _flash_attn_any(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    return_lse: bool,
    out: Any,
    key: Any,
    route: bool = True,
) -> Any | tuple[Any, Any]:
    """The general path: any framework, every check; records the plan of a torch signature
    (`key`, not None when every array is a torch tensor) it sends to the GPU. With `route`,
    torch calls that need gradients go to the differentiable op registered in `_routes` (by
    `flashscan.torch`, whose op comes back here with route=False)."""
    tq = type(q)
    hq = _HANDLERS.get(tq) or _resolve(q, "q")
    if route and needs_autograd(hq, (q, k, v)):
        return _differentiable(
            q, k, v, softmax_scale, causal, window_size, softcap, return_lse, out
        )
    dq = hq.describe(q, "q")
    hk = hq if type(k) is tq else (_HANDLERS.get(type(k)) or _resolve(k, "k"))
    dk = hk.describe(k, "k")
    hv = hq if type(v) is tq else (_HANDLERS.get(type(v)) or _resolve(v, "v"))
    dv = hv.describe(v, "v")
    # a torch signature served once goes to a plan: the check memo would only duplicate it
    check = _checks.attention if key is not None else _checks.attention_memo
    b, sq, h, d, sk, _ = check(dq, dk, dv)
    scale, wl, wr, cap, causal, return_lse = _checks.attention_options(
        d, causal, window_size, softmax_scale, softcap, return_lse
    )

    ho: Handler | None = None
    do: Desc | None = None
    if out is not None:
        ho = hq if type(out) is tq else (_HANDLERS.get(type(out)) or _resolve(out, "out"))
        do = ho.describe(out, "out")
        _checks.out_like("out", out, ho, do, dq[1], dq[3], "q", dq, "(like q)")
        _checks.contiguous_last("out", do, "headdim")

    if dq[4] == CUDA and b and sq and h and sk:
        if dq[5] in _usable_devices():
            # --- the GPU, general path ------------------------------------------------------
            if key is not None:
                _checks.remember(_PLANS, key, _plan(hq, dq, b, sq, h, d))
            stream = hq.stream(dq[5])
            out, oa, lse, la = out_and_lse(
                hq, q, dq, out, ho, do, (b, h, sq) if return_lse else None
            )
            _native.flash_attn_fwd(  # type: ignore[union-attr]
                dq if hq.fast else q,
                dk if hk.fast else k,
                dv if hv.fast else v,
                oa,
                la,
                scale,
                wl,
                wr,
                cap,
                stream,
            )
            out, lse = finished(hq, out, lse)
            return (out, lse) if return_lse else out
        _backend.on_fallback("flash_attn_func", _backend.device_reason(dq[5]), depth=2)
    elif dq[4] != CPU and dq[4] != CUDA:  # pragma: no cover - rejected by the checks
        raise ValueError(f"q: unsupported device type {dq[4]}")

    return _on_host(q, k, v, hq, hk, hv, dq, scale, causal, (wl, wr), cap, return_lse, out, ho)


def _differentiable(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    return_lse: bool,
    out: Any,
) -> Any | tuple[Any, Any]:
    """A torch call that needs gradients: the differentiable op registered in `_routes`
    (`flashscan.torch.flash_attn_func`)."""
    if out is not None:
        raise ValueError(
            "out: an out= array cannot take part in autograd (q, k or v requires grad); "
            "drop out=, or call under torch.no_grad()"
        )
    return _routes.differentiable("flash_attn_func")(
        q, k, v, softmax_scale, causal, window_size, softcap, return_lse=return_lse
    )


def _on_host(
    q: Any,
    k: Any,
    v: Any,
    hq: Handler,
    hk: Handler,
    hv: Handler,
    dq: Desc,
    scale: float,
    causal: bool,
    window: tuple[int, int],
    cap: float,
    return_lse: bool,
    out: Any,
    ho: Handler | None,
) -> Any | tuple[Any, Any]:
    """The reference on host copies (CPU arrays, empty problems, the fallback)."""
    qh, kh, vh = hq.to_host(q), hk.to_host(k), hv.to_host(v)
    o, lse = reference.flash_attn_func(
        qh,
        kh,
        vh,
        softmax_scale=scale,
        causal=causal,
        window_size=window,
        softcap=cap,
        return_lse=True,
    )
    if out is None:
        out = hq.from_host(o, dq[3], q, dq)
    else:
        assert ho is not None
        ho.copy_into(out, o)
    if not return_lse:
        return out
    return out, hq.from_host(np.asarray(lse, dtype=np.float32), "float32", q, dq)
