"""FP8 (e4m3) attention forward: `flash_attn_func` with torch.float8_e4m3fn q / k / v and
flash-attn 3's `q_descale` / `k_descale` / `v_descale`; the output is bfloat16.

On Hopper (sm_90) with a head dim of 80, 96, 112 or 128 (multiples of 16 above 64, on the
kernel's 128 tile) and no softcap, the FP8 kernel runs (`_native.flash_attn_fwd_fp8`: S = Q K^T
and O = P V on e4m3 tensor cores, P rounded to e4m3). Everywhere else (other GPUs, other head
dims, softcap, CPU tensors) the inputs are dequantised (value x descale) and the 16-bit kernels
(bfloat16) or the NumPy reference run on them, so every call answers, at 16-bit speed. Head dims
16-64 would run on the 128 tile too, at 0.66-0.94x SDPA cuDNN's bf16 and below flashscan's own
bf16 kernel (H200, 2026-12-03): they take the 16-bit path unless FLASHSCAN_FP8_SMALL_HEAD_DIMS=1
(testing; read on every call).

Descales are float32 tensors of shape (batch, nheads_k) (flash-attn 3's), or any shape that
broadcasts to it; None means 1. The scores are softmax_scale * (q k^T) * q_descale * k_descale
and the output (P V) * v_descale, per (batch, kv head).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from . import _backend, _checks
from ._frameworks import CUDA

__all__ = ["is_fp8", "flash_attn_fp8"]

_FP8_NAME = "float8_e4m3fn"


def is_fp8(x: Any) -> bool:
    """Whether x is a torch float8_e4m3fn tensor (the FP8 forward's input)."""
    dt = getattr(x, "dtype", None)
    return dt is not None and str(dt) == "torch." + _FP8_NAME


def _descale_2d(t: Any, name: str, b: int, hk: int, device: Any) -> Any:
    """The descale as a float32 (b, hk) view (broadcast), checked."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: expected a float32 torch tensor of shape (batch, nheads_k), got {type(t)}"
        )
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: expected float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")
    if t.dim() > 2:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}: expected (batch, nheads_k) = ({b}, {hk})"
        )
    try:
        return t.reshape((1,) * (2 - t.dim()) + tuple(t.shape)).expand(b, hk)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}: expected (batch, nheads_k) = ({b}, {hk}) or a "
            "broadcastable shape"
        ) from None


# device ordinal -> whether it is sm_90 (the FP8 kernel's arch); filled on first use, replaced
# whole (thread-safe)
_SM90: dict[int, bool] = {}


def _is_sm90(torch: Any, dev: int) -> bool:
    global _SM90
    got = _SM90.get(dev)
    if got is None:
        got = torch.cuda.get_device_capability(dev) == (9, 0)
        _SM90 = {**_SM90, dev: got}
    return got


def _desc(t: Any, dtype: str, dev: int) -> tuple[Any, ...]:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), dtype, CUDA, dev)


def flash_attn_fp8(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    return_lse: bool,
    out: Any,
    q_descale: Any,
    k_descale: Any,
    v_descale: Any,
    dense: Callable[..., Any],
) -> Any:
    """`flash_attn_func` on float8_e4m3fn torch tensors (see the module's docstring). `dense` is
    the 16-bit `flash_attn_func` the dequantised inputs go to (passed in by `attention`, which
    imports this module: no import cycle)."""
    try:
        import torch
    except ImportError:  # (descales given with another framework's arrays)
        raise TypeError("FP8 attention takes torch tensors (torch is not installed)") from None

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: FP8 attention takes torch tensors (got {type(t)})")
    if not (is_fp8(q) and is_fp8(k) and is_fp8(v)):
        raise TypeError(
            "q_descale / k_descale / v_descale apply to float8_e4m3fn q, k and v; got "
            f"{q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "q must be (batch, seqlen_q, nheads, headdim) and k, v (batch, seqlen_k, nheads_k, "
            f"headdim); got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, sq, h, d = q.shape
    hk = k.shape[2]
    if k.shape[0] != b or k.shape[3] != d or tuple(v.shape) != tuple(k.shape):
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch={b}, seqlen_k, nheads_k, "
            f"headdim={d}) like q {tuple(q.shape)}"
        )
    if hk == 0 or h % hk:
        raise ValueError(f"nheads = {h} must be a multiple of nheads_k = {hk} (GQA/MQA)")
    scale, wl, wr, cap, causal, return_lse = _checks.attention_options(
        d, causal, window_size, softmax_scale, softcap, return_lse
    )
    named = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    ds = [None if t is None else _descale_2d(t, name, b, hk, q.device) for name, t in named]
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.shape != q.shape:
            raise ValueError(
                f"out: FP8 attention writes a bfloat16 tensor of q's shape {tuple(q.shape)}"
            )
    dev = q.device.index if q.is_cuda else None
    fast = (
        dev is not None
        and d % 16 == 0
        and d <= 128
        and (d > 64 or os.environ.get("FLASHSCAN_FP8_SMALL_HEAD_DIMS") == "1")
        and cap == 0.0
        and dev in _backend.usable_devices()
        and _is_sm90(torch, dev)
        and b * sq * h > 0
        and k.shape[1] > 0
    )
    if fast:
        if out is None:
            out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device) if return_lse else None
        _backend.native.flash_attn_fwd_fp8(  # type: ignore[union-attr]
            _desc(q, _FP8_NAME, dev),
            _desc(k, _FP8_NAME, dev),
            _desc(v, _FP8_NAME, dev),
            _desc(out, "bfloat16", dev),
            None if lse is None else _desc(lse, "float32", dev),
            *(None if t is None else _desc(t, "float32", dev) for t in ds),
            scale,
            wl,
            wr,
            torch.cuda.current_stream(dev).cuda_stream,
        )
        return (out, lse) if return_lse else out
    # elsewhere: dequantise, then the 16-bit kernels (GPU) or the reference (CPU)
    wide = torch.bfloat16 if q.is_cuda else torch.float32
    group = h // hk

    def deq(t: Any, s: Any, per_q_head: bool) -> Any:
        x = t.to(torch.float32)
        if s is not None:
            s = s.repeat_interleave(group, dim=1) if per_q_head else s
            x = x * s[:, None, :, None]
        return x.to(wide)

    res = dense(
        deq(q, ds[0], True),
        deq(k, ds[1], False),
        deq(v, ds[2], False),
        softmax_scale=scale,
        window_size=(wl, wr),
        softcap=cap,
        return_lse=True,
    )
    o, lse = res
    o = o.to(torch.bfloat16)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_lse else o
