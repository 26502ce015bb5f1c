"""`flash_attn_func`: flash-attn's forward, on the CUDA backend or the NumPy reference.

Dispatch: checks (`_checks.attention`), then
- CUDA arrays on a device the backend serves -> `_native.flash_attn_fwd` on the caller's
  current stream, outputs allocated in the caller's framework (or taken from `out=`);
- CPU arrays -> `reference.flash_attn_func`;
- CUDA arrays the backend cannot serve -> the fallback policy, then the reference on the host.

The CUDA path is the hot one (real-time callers make thousands of calls a second): it looks
handlers up in a per-type dict, takes fast paths for default options and does no imports,
no environment reads and no exception handling.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _backend, _checks, reference
from ._frameworks import _HANDLERS, CPU, CUDA, Desc, Handler, _resolve

__all__ = ["flash_attn_func"]

_native = _backend.native
_usable_devices = _backend.usable_devices
_INF = math.inf
_NO_WINDOW = (-1, -1)


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
    """
    tq = type(q)
    hq = _HANDLERS.get(tq) or _resolve(q, "q")
    dq = hq.describe(q, "q")
    hk = hq if type(k) is tq else (_HANDLERS.get(type(k)) or _resolve(k, "k"))
    dk = hk.describe(k, "k")
    hv = hq if type(v) is tq else (_HANDLERS.get(type(v)) or _resolve(v, "v"))
    dv = hv.describe(v, "v")
    b, sq, h, d, sk, _ = _checks.attention_memo(dq, dk, dv)

    if causal is not False and causal is not True:
        causal = _checks.flag("causal", causal)
    if return_lse is not False and return_lse is not True:
        return_lse = _checks.flag("return_lse", return_lse)
    if window_size is _NO_WINDOW or (type(window_size) is tuple and window_size == _NO_WINDOW):
        wl, wr = -1, (0 if causal else -1)
    else:
        wl, wr = _checks.window(window_size, causal)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    elif type(softmax_scale) is float and -_INF < softmax_scale < _INF:
        scale = softmax_scale
    else:
        scale = _checks.real("softmax_scale", softmax_scale)
    if type(softcap) is float and 0.0 <= softcap < _INF:
        cap = softcap
    else:
        cap = _checks.real("softcap", softcap, minimum=0.0)

    ho: Handler | None = None
    do: Desc | None = None
    if out is not None:
        ho = hq if type(out) is tq else (_HANDLERS.get(type(out)) or _resolve(out, "out"))
        do = ho.describe(out, "out")
        _checks.out_like("out", out, ho, do, dq[1], dq[3], "q", dq, "(like q)")
        _checks.contiguous_last("out", do, "headdim")

    if dq[4] == CUDA and b and sq and h and sk:
        if dq[5] in _usable_devices():
            # --- the hot path -------------------------------------------------------------
            stream = hq.stream(dq[5])
            if out is None:
                out = hq.empty(dq[1], dq[3], q, dq)
                oa = hq.describe_new(out, dq[1], dq[3], dq) if hq.fast else out
            else:
                oa = do if ho.fast else out  # type: ignore[union-attr]
            lse = la = None
            if return_lse:
                lse_shape = (b, h, sq)
                lse = hq.empty(lse_shape, "float32", q, dq)
                la = hq.describe_new(lse, lse_shape, "float32", dq) if hq.fast else lse
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
            if hq.needs_finish:
                out = hq.finish(out)
                if lse is not None:
                    lse = hq.finish(lse)
            return (out, lse) if return_lse else out
        _backend.on_fallback("flash_attn_func", _backend.device_reason(dq[5]))
    elif dq[4] != CPU and dq[4] != CUDA:  # pragma: no cover - rejected by the checks
        raise ValueError(f"q: unsupported device type {dq[4]}")

    return _on_host(q, k, v, hq, hk, hv, dq, scale, causal, (wl, wr), cap, return_lse, out, ho)


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
