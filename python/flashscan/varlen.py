"""`flash_attn_varlen_func`: flash-attn's attention over packed variable-length sequences, on
the CUDA backend or the NumPy reference.

Dispatch: checks (`_checks.varlen`, and `_checks.cu_seqlens_values` where the cu_seqlens
values are on the host), then
- CUDA arrays on a device the backend serves -> `_native.flash_attn_varlen_fwd` on the caller's
  current stream (the packed-sequence builds of the dense kernels; they clamp every row bound
  they read from cu_seqlens, so device values that the host cannot see without a
  synchronisation never index out of bounds: set FLASHSCAN_CHECK_INDICES=1 to have them read
  back and checked anyway);
- CPU arrays -> `reference_varlen.flash_attn_varlen_func`;
- CUDA arrays the backend cannot serve -> the fallback policy, then the reference on the host.
Torch calls that need gradients go to `flashscan.torch.flash_attn_varlen_func` (through
`_routes`), whose backward runs `_native.flash_attn_varlen_bwd`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _backend, _checks, _routes, reference_varlen
from ._frameworks import (
    _HANDLERS,
    CPU,
    CUDA,
    Handler,
    _resolve,
    finished,
    needs_autograd,
    out_and_lse,
)
from .kvcache import _check_indices_on_gpu

__all__ = ["flash_attn_varlen_func"]

_native = _backend.native
_NO_WINDOW = _checks.NO_WINDOW


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = _NO_WINDOW,
    softcap: float = 0.0,
    return_lse: bool = False,
    out: Any = None,
) -> Any | tuple[Any, Any]:
    """Attention over packed sequences, flash-attn's `flash_attn_varlen_func`.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim) with nheads % nheads_k
    == 0; float16, bfloat16 or float32; headdim a multiple of 8 up to 256, last dimension
    contiguous. cu_seqlens_q / cu_seqlens_k: int32 (batch + 1,) on q's device, starting at 0,
    non-decreasing, ending at total_q / total_k: sequence b owns rows
    cu_seqlens[b]:cu_seqlens[b+1]. max_seqlen_q / max_seqlen_k: at least the longest
    sequence's length (the kernels cover that many rows per sequence).

    softmax_scale, causal, window_size, softcap: as `flash_attn_func`, per sequence (masks
    aligned bottom-right to each sequence's own lengths). A query that sees no key (a sequence
    with no keys, or a window) gets output 0 and lse -inf.

    Returns out (like q; written into `out` when given) and, with return_lse=True, (out, lse)
    with lse (nheads, total_q) float32. CUDA work runs on the caller's current stream with no
    host synchronisation (graph-capturable with `out=`).
    """
    return varlen_any(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        return_lse,
        out,
    )


def _handler(x: Any, arg: str, ref: Handler, ref_type: type) -> Handler:
    return ref if type(x) is ref_type else (_HANDLERS.get(type(x)) or _resolve(x, arg))


def varlen_any(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    softmax_scale: float | None,
    causal: bool,
    window_size: Any,
    softcap: float,
    return_lse: bool,
    out: Any,
    route: bool = True,
) -> Any | tuple[Any, Any]:
    """Every check, then the GPU or the reference. With `route`, torch calls that need
    gradients go to the differentiable op registered in `_routes` (whose forward comes back
    here with route=False)."""
    tq_type = type(q)
    hq = _HANDLERS.get(tq_type) or _resolve(q, "q")
    if route and needs_autograd(hq, (q, k, v)):
        if out is not None:
            raise ValueError(
                "out: an out= array cannot take part in autograd (q, k or v requires grad); "
                "drop out=, or call under torch.no_grad()"
            )
        return _routes.differentiable("flash_attn_varlen_func")(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            causal,
            window_size,
            softcap,
            return_lse=return_lse,
        )
    dq = hq.describe(q, "q")
    hk = _handler(k, "k", hq, tq_type)
    hv = _handler(v, "v", hq, tq_type)
    hcq = _handler(cu_seqlens_q, "cu_seqlens_q", hq, tq_type)
    hck = _handler(cu_seqlens_k, "cu_seqlens_k", hq, tq_type)
    dk = hk.describe(k, "k")
    dv = hv.describe(v, "v")
    dcq = hcq.describe(cu_seqlens_q, "cu_seqlens_q")
    dck = hck.describe(cu_seqlens_k, "cu_seqlens_k")
    batch, total_q, h, d, total_k, _ = _checks.varlen(dq, dk, dv, dcq, dck)
    max_q = _checks.nonnegative_int("max_seqlen_q", max_seqlen_q)
    max_k = _checks.nonnegative_int("max_seqlen_k", max_seqlen_k)

    scale, wl, wr, cap, causal, return_lse = _checks.attention_options(
        d, causal, window_size, softmax_scale, softcap, return_lse
    )

    ho: Handler | None = None
    do = None
    if out is not None:
        ho = _handler(out, "out", hq, tq_type)
        do = ho.describe(out, "out")
        _checks.out_like("out", out, ho, do, dq[1], dq[3], "q", dq, "(like q)")
        _checks.contiguous_last("out", do, "headdim")

    cu_host = None
    if dcq[4] == CPU or _check_indices_on_gpu():
        cu_host = (hcq.to_host(cu_seqlens_q), hck.to_host(cu_seqlens_k))
        _checks.cu_seqlens_values("cu_seqlens_q", cu_host[0], total_q, max_q, "max_seqlen_q")
        _checks.cu_seqlens_values("cu_seqlens_k", cu_host[1], total_k, max_k, "max_seqlen_k")

    if dq[4] == CUDA and batch and total_q and h and total_k and max_q:
        refusal = _gpu_refusal(dq)
        if refusal is None:
            stream = hq.stream(dq[5])
            out, oa, lse, la = out_and_lse(
                hq, q, dq, out, ho, do, (h, total_q) if return_lse else None
            )
            _native.flash_attn_varlen_fwd(  # type: ignore[union-attr]
                dq if hq.fast else q,
                dk if hk.fast else k,
                dv if hv.fast else v,
                dcq if hcq.fast else cu_seqlens_q,
                dck if hck.fast else cu_seqlens_k,
                oa,
                la,
                max_q,
                max_k,
                scale,
                wl,
                wr,
                cap,
                stream,
            )
            out, lse = finished(hq, out, lse)
            return (out, lse) if return_lse else out
        _backend.on_fallback("flash_attn_varlen_func", refusal, depth=2)

    if cu_host is None:
        cu_host = (hcq.to_host(cu_seqlens_q), hck.to_host(cu_seqlens_k))
        # the host path reads the values: they must be valid here whatever the device
        _checks.cu_seqlens_values("cu_seqlens_q", cu_host[0], total_q, max_q, "max_seqlen_q")
        _checks.cu_seqlens_values("cu_seqlens_k", cu_host[1], total_k, max_k, "max_seqlen_k")
    o, lse_h = reference_varlen.flash_attn_varlen_func(
        hq.to_host(q),
        hk.to_host(k),
        hv.to_host(v),
        cu_host[0],
        cu_host[1],
        softmax_scale=scale,
        window_size=(wl, wr),
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
    return out, hq.from_host(np.asarray(lse_h, dtype=np.float32), "float32", q, dq)


def _gpu_refusal(dq: Any) -> str | None:
    """Why CUDA arrays on q's device cannot run on the GPU here, or None when they can."""
    if dq[5] not in _backend.usable_devices():
        return _backend.device_reason(dq[5])
    if _native is None or not hasattr(_native, "flash_attn_varlen_fwd"):
        return (
            "this build of flashscan._native has no flash_attn_varlen_fwd kernel (it predates "
            "the varlen kernels; install a newer flashscan)"
        )
    return None
