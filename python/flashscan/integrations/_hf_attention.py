"""transformers' attention on flashscan: the attention function and its mask function.

transformers calls an attention function with q, k, v in (batch, heads, seqlen, headdim), the
module (its config, `is_causal`, `num_key_value_groups`), and what its mask function built.
Ours builds no (q, k) mask at all when it can avoid it: causal and the sliding window come from
the module's arguments, padding from the 2D padding mask, which is what flash-attn's kernels
need. So the mask function returns

- None: no padding, nothing to mask beyond causal / window (the dense kernel call);
- the 2D bool padding mask (batch, kv_length), True = a real token: padding;
- a materialised 4D bool mask (batch, 1, q_length, kv_length) from transformers' own SDPA
  mask, when the pattern is one our kernels cannot express (packed sequences in one row,
  block / bidirectional overlays, chunked attention, custom mask functions).

and the attention function serves each:

- no mask: `flashscan.flash_attn_func` (decode steps: `flashscan.flash_attn_with_kvcache`,
  the split-KV decode kernel, over the k/v transformers' cache hands us);
- padding: left padding in a decode step -> `flash_attn_with_kvcache(cache_leftpad=)`;
  otherwise the real tokens are gathered into packed rows and run through
  `flashscan.flash_attn_varlen_func` when this flashscan has it, else one `flash_attn_func`
  call per sequence (a host read of the lengths). Padded query rows come back as zeros (their
  values are never read by a real token);
- a 4D mask (ours or one a caller built): a plain torch attention with that mask, the one
  documented slow path (a warning says so once).

Dropout must be 0 (inference, or training without attention dropout): the kernels have none,
and a silent no-dropout would change training.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch
from torch import Tensor

import flashscan

__all__ = ["attention_forward", "mask_function"]

_HALF = (torch.float16, torch.bfloat16)
_warned_math = False


# ---------------------------------------------------------------------------------------------
# The mask function (AttentionMaskInterface)
# ---------------------------------------------------------------------------------------------


def mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> Tensor | None:
    """What our attention needs to know beyond causal / window: None, the 2D padding mask, or
    (for patterns the kernels cannot express) transformers' materialised 4D bool mask."""
    if _needs_materialised_mask(q_length, kwargs):
        from transformers.masking_utils import sdpa_mask

        kwargs = {k: v for k, v in kwargs.items() if k != "allow_is_causal_skip"}
        kwargs.pop("allow_is_bidirectional_skip", None)
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            allow_is_causal_skip=False,
            allow_is_bidirectional_skip=False,
            **kwargs,
        )
    if attention_mask is None:
        return _filled_slots(batch_size, q_length, kv_length, q_offset, kv_offset, kwargs)
    # keys only: a sliding-window cache holds the last kv_length positions of the mask
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def _filled_slots(
    batch_size: int, q_length: int, kv_length: int, q_offset: Any, kv_offset: Any, kw: Any
) -> Tensor | None:
    """No padding mask (generate drops an all-ones one), but a static cache hands over all
    kv_length slots of which only the first q_offset + q_length are filled: an all-True mask
    of the filled ones (shorter than k/v: the attention cuts k/v to it, as for a padded
    static cache), or None when every slot is filled (a dynamic cache)."""
    if isinstance(kv_offset, Tensor) or kv_offset != 0:
        return None  # a sliding static layer: its slots are the window
    filled = int(q_offset) + q_length  # a host read when the cache keeps it on the device
    if filled >= kv_length:
        return None
    device = q_offset.device if isinstance(q_offset, Tensor) else kw.get("device", "cpu")
    return torch.ones(batch_size, filled, dtype=torch.bool, device=device)


def _needs_materialised_mask(q_length: int, kw: dict[str, Any]) -> bool:
    """True when the mask function transformers composed is more than causal / bidirectional
    / a sliding window of config.sliding_window (which the attention call receives anyway)."""
    if kw.get("use_vmap"):
        return True  # or_mask_function / and_mask_function: a caller's own pattern
    local_size = kw.get("local_size")
    if local_size is not None:
        config = kw.get("config")
        if local_size != getattr(config, "sliding_window", None):
            return True  # chunked attention (attention_chunk_size), not a sliding window
    # create_causal_mask turns the skip off for packed sequences and block overlays (and for a
    # compileable cache's decode step, q_length == 1, where the pattern is still plain);
    # create_bidirectional_mask always passes it off, with allow_is_bidirectional_skip.
    if "allow_is_bidirectional_skip" in kw:
        return False
    return kw.get("allow_is_causal_skip", True) is False and q_length > 1


# ---------------------------------------------------------------------------------------------
# The attention function (AttentionInterface)
# ---------------------------------------------------------------------------------------------


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: q (batch, heads, seqlen_q, hd), k, v
    (batch, heads_k, seqlen_k, hd) -> ((batch, seqlen_q, heads, hd), None)."""
    if dropout:
        raise flashscan.UnsupportedError(
            f"flashscan attention has no dropout (got dropout={dropout}); use the model in "
            "eval mode or set the config's attention_dropout to 0"
        )
    if kwargs.get("s_aux") is not None:
        raise flashscan.UnsupportedError(
            "flashscan attention does not support attention sinks (s_aux); use 'sdpa' or 'eager'"
        )
    if kwargs.get("cache") is not None:
        raise flashscan.UnsupportedError(
            "flashscan attention does not serve transformers' paged cache (continuous batching)"
        )
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if scaling is None:
        scaling = 1.0 / math.sqrt(query.shape[-1])
    cap = 0.0 if softcap is None else float(softcap)
    window = _window(sliding_window, causal)

    hd, v_hd = query.shape[-1], value.shape[-1]
    if v_hd != hd:  # MLA: v's head dim below q's; pad v, crop the output
        value = torch.nn.functional.pad(value, (0, hd - v_hd))

    # (batch, heads, seq, hd) -> (batch, seq, heads, hd): a view, the last dim stays contiguous
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    args = (float(scaling), causal, window, cap)

    if attention_mask is None:
        out = _dense(q, k, v, *args)
    elif attention_mask.dim() == 2:
        out = _padded(q, k, v, attention_mask, *args)
    elif attention_mask.dim() == 4:
        out = _masked_math(query, key, value, attention_mask, float(scaling), cap)
    else:
        raise flashscan.UnsupportedError(
            f"flashscan attention takes no mask, a 2D padding mask or a 4D mask; got a mask of "
            f"shape {tuple(attention_mask.shape)}"
        )
    if v_hd != hd:
        out = out[..., :v_hd]
    return out, None


def _window(sliding_window: int | None, causal: bool) -> tuple[int, int]:
    """transformers' window W as flash-attn's (left, right): causally a query sees itself and
    the W - 1 keys before it (kv > q - W); bidirectionally |q - kv| <= W."""
    if sliding_window is None:
        return (-1, -1)
    w = int(sliding_window)
    if w <= 0:
        raise ValueError(f"sliding_window must be a positive int, got {sliding_window!r}")
    return (w - 1, 0) if causal else (w, w)


def _decode_route(q: Tensor) -> bool:
    """One query per sequence: the split-KV decode kernel serves it (fp16 / bf16 on the GPU;
    the reference on the CPU). It has no backward: not when a gradient is wanted."""
    return (
        q.shape[1] == 1
        and (q.dtype in _HALF or not q.is_cuda)
        and not (q.requires_grad and torch.is_grad_enabled())
    )


def _dense(
    q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, window: Any, cap: float
) -> Tensor:
    if _decode_route(q):
        # the caches transformers hands over are whole (cache_seqlens=None: every slot valid)
        return flashscan.flash_attn_with_kvcache(
            q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=cap
        )
    return flashscan.flash_attn_func(
        q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=cap
    )


class _PaddingPlan:
    """What one padding mask means for the kernels, worked out once per mask (every layer of
    a forward gets the same mask object; each host read below is a GPU synchronisation).

    keys: how many key slots the mask covers (a static cache's k/v have more: cut to it);
    kind: "dense" (no padding after all), "leftpad" (a decode step with left padding: the
    kvcache kernel with cache_leftpad=pad) or "varlen" (gather the real tokens: q_idx / k_idx
    into the flattened rows, cu_q / cu_k int32 cumulative lengths, lens_q / lens_k on host)."""

    def __init__(self, mask: Tensor, sq: int, sk: int, decode: bool) -> None:
        self.keys = min(mask.shape[1], sk)
        mask = mask[:, -self.keys :]
        self.kind = "dense"
        if bool(mask.all()):
            return
        if decode:
            # left padding (generation's layout): the real keys of row b are [pad_b, keys)
            pad = (~mask).sum(dim=1, dtype=torch.int32)
            left = torch.arange(self.keys, device=mask.device)[None, :] >= pad[:, None]
            if bool(torch.equal(left, mask)):
                self.kind, self.pad = "leftpad", pad
                return
        self.kind = "varlen"
        q_mask = mask[:, -sq:]
        self.q_idx = q_mask.reshape(-1).nonzero().squeeze(1)
        self.k_idx = mask.reshape(-1).nonzero().squeeze(1)
        n_q, n_k = q_mask.sum(1, dtype=torch.int32), mask.sum(1, dtype=torch.int32)
        zero = torch.zeros(1, dtype=torch.int32, device=mask.device)
        self.cu_q = torch.cat([zero, n_q.cumsum(0, dtype=torch.int32)])
        self.cu_k = torch.cat([zero, n_k.cumsum(0, dtype=torch.int32)])
        self.lens_q, self.lens_k = n_q.tolist(), n_k.tolist()


# the plans of the last few masks seen, by mask object (held here, so an id is not reused
# while its entry lives) and version (an in-place change of the mask bumps it); a forward
# uses one or two masks (full and sliding layers)
_PLANS: list[tuple[Tensor, tuple[int, int, int, bool], _PaddingPlan]] = []


def _plan(mask: Tensor, sq: int, sk: int, decode: bool) -> _PaddingPlan:
    key = (mask._version, sq, sk, decode)
    for m, k, plan in _PLANS:
        if m is mask and k == key:
            return plan
    plan = _PaddingPlan(mask, sq, sk, decode)
    _PLANS.insert(0, (mask, key, plan))
    del _PLANS[4:]
    return plan


def _padded(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    scale: float,
    causal: bool,
    window: Any,
    cap: float,
) -> Tensor:
    """q (b, sq, h, hd), k/v (b, sk, hk, hd), mask (b, m) True = real token. The mask covers
    the keys from the right (the queries are the last sq of them); a static cache's mask is
    shorter than its k/v (the slots past it are empty): cut k/v to it."""
    b, sq = q.shape[0], q.shape[1]
    if mask.dtype != torch.bool or mask.device != q.device:
        mask = mask.to(device=q.device, dtype=torch.bool)
    plan = _plan(mask, sq, k.shape[1], _decode_route(q))
    if plan.keys < k.shape[1]:
        k, v = k[:, : plan.keys], v[:, : plan.keys]
    sk = k.shape[1]
    if sq > sk:
        raise ValueError(f"the attention mask covers {sk} keys, fewer than the {sq} queries")
    if plan.kind == "dense":
        return _dense(q, k, v, scale, causal, window, cap)
    if plan.kind == "leftpad":
        return flashscan.flash_attn_with_kvcache(
            q,
            k,
            v,
            cache_leftpad=plan.pad,
            softmax_scale=scale,
            causal=causal,
            window_size=window,
            softcap=cap,
        )
    qp = q.reshape(b * sq, *q.shape[2:])[plan.q_idx]
    kp = k.reshape(b * sk, *k.shape[2:])[plan.k_idx]
    vp = v.reshape(b * sk, *v.shape[2:])[plan.k_idx]
    out_p = varlen_attention(qp, kp, vp, plan, scale, causal, window, cap)
    out = q.new_zeros(b * sq, *q.shape[2:])
    out[plan.q_idx] = out_p
    return out.view(b, sq, *q.shape[2:])


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: _PaddingPlan,
    scale: float,
    causal: bool,
    window: Any,
    cap: float,
) -> Tensor:
    """Packed rows (total, heads, hd): flashscan's `flash_attn_varlen_func` (flash-attn's
    signature) when this flashscan has it, else one `flash_attn_func` call per sequence."""
    varlen = getattr(flashscan, "flash_attn_varlen_func", None)
    if varlen is not None:
        return varlen(
            q,
            k,
            v,
            plan.cu_q,
            plan.cu_k,
            max(plan.lens_q, default=0),
            max(plan.lens_k, default=0),
            softmax_scale=scale,
            causal=causal,
            window_size=window,
            softcap=cap,
        )
    out = q.new_empty(q.shape)
    sq = sk = 0
    for nq, nk in zip(plan.lens_q, plan.lens_k):
        if nq:
            out[sq : sq + nq] = flashscan.flash_attn_func(
                q[None, sq : sq + nq],
                k[None, sk : sk + nk],
                v[None, sk : sk + nk],
                softmax_scale=scale,
                causal=causal,
                window_size=window,
                softcap=cap,
            )[0]
        sq, sk = sq + nq, sk + nk
    return out


def _masked_math(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float, cap: float
) -> Tensor:
    """Plain attention under a 4D mask (bool: True attends; float: added to the scores), in
    float32, as transformers' eager path computes it: the documented slow path."""
    global _warned_math
    if not _warned_math:
        _warned_math = True
        warnings.warn(
            "flashscan attention got a 4D attention mask (a pattern beyond causal / sliding "
            "window / padding: packed sequences, chunked or custom masks); it runs a plain "
            "torch attention for it, not the flashscan kernels",
            stacklevel=3,
        )
    n_rep = query.shape[1] // key.shape[1]
    if n_rep > 1:
        key = key.repeat_interleave(n_rep, dim=1)
        value = value.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if cap > 0.0:
        scores = cap * torch.tanh(scores / cap)
    mask = mask[..., : key.shape[2]]
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value.float()).to(query.dtype)
    return out.transpose(1, 2).contiguous()
