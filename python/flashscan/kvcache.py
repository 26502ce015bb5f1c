"""`flash_attn_with_kvcache`: decode attention against a KV cache the call updates in place.

Dispatch: checks (`_checks.kvcache`), then
- CUDA arrays on a device the backend serves -> `_native.kvcache_append` (when k/v or rotary
  are given: new keys and values into the cache, q rotated into a scratch array like q), then
  `_native.flash_attn_kvcache`, both on the caller's current stream with no host
  synchronisation; outputs allocated in the caller's framework (or taken from `out=`);
- CPU arrays -> `reference_kvcache.flash_attn_with_kvcache`, which updates NumPy caches in place
  (other frameworks' caches get the update copied back);
- CUDA arrays the backend cannot serve (no usable device, a native module that predates the
  decode kernels, float32 where the native core refuses it) -> the fallback policy, then the
  reference on host copies, and the cache update copied back into the caller's caches.

For torch tensors the CUDA path is also a plan lookup, as in `attention.py`: a decode loop
repeats one signature (each tensor's shape, strides, dtype and device; cache_seqlens a tensor),
so after the general path has checked and served it once, later calls check only the options,
allocate out (and lse when asked) and make the one or two `_native` calls.

The values inside the int32 index tensors (cache_seqlens, cache_batch_idx, cache_leftpad,
block_table) are checked on the host wherever they are on the host already; on the GPU reading
them costs a synchronisation (and breaks graph capture), so there they are checked only with
FLASHSCAN_CHECK_INDICES=1, and otherwise the kernels clamp what they read (see the contract in
the native core: a block id out of range is never dereferenced, its row's output is NaN).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _backend, _checks, reference_kvcache
from ._frameworks import (
    CPU,
    CUDA,
    TORCH_TYPES,
    Desc,
    Handler,
    finished,
    handler_of,
    new_output,
    out_and_lse,
)

__all__ = ["flash_attn_with_kvcache"]

_native = _backend.native
_OP = "flash_attn_with_kvcache"
_NO_WINDOW = _checks.NO_WINDOW
# Python / NumPy scalars given as cache_seqlens: ints are broadcast, others refused by name
_SCALARS = (int, float, np.integer, np.floating, np.bool_)
# set once the native core has refused float32 q (UnsupportedError): later float32 calls go to
# the host without asking again
_FP32_REFUSED: str | None = None
_NO_DEVICES: frozenset[int] = frozenset()
# signature -> plan (see `_plan`), and the last pair found, as in attention.py: replaced whole,
# never mutated (thread-safe); bounded like the check memos.
_PLANS: dict[Any, tuple[Any, ...]] = {}
_LAST: tuple[Any, Any] = (None, None)


def flash_attn_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: Any = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = _NO_WINDOW,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    num_splits: int = 0,
    return_lse: bool = False,
    out: Any = None,
) -> Any | tuple[Any, Any]:
    """Attention of q over a KV cache, after appending k/v into it IN PLACE; flash-attn's
    `flash_attn_with_kvcache` (decode, speculative decoding, chunked prefill).

    q: (batch, seqlen_q, nheads, headdim), seqlen_q >= 1; float16, bfloat16 or float32 (one
    dtype for q, the caches and k/v); headdim a multiple of 8 up to 256; nheads a multiple of
    nheads_k (GQA/MQA); the last dimension of every array contiguous.
    k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim) with batch_cache >= batch,
    or, with block_table, a paged cache (num_blocks, block_size, nheads_k, headdim), block_size
    a multiple of 16. block_table: int32 (batch, max_blocks_per_seq): block j of sequence b
    holds its positions [j * block_size, (j + 1) * block_size).
    k, v: (batch, seqlen_new, nheads_k, headdim) or None: written into the caches at positions
    cache_seqlens[b] + i (the caches change; cache_seqlens does not: advance it yourself).
    cache_seqlens: int32 (batch,) or an int, the valid tokens of each cache row BEFORE the
    append (required with k/v; None means the whole cache is valid). An int is turned into an
    array on q's device (a host-to-device copy per call: pass an array in a CUDA graph).
    cache_batch_idx: int32 (batch,): the cache row of sequence b (contiguous caches only).
    cache_leftpad: int32 (batch,): slots [0, cache_leftpad[b]) of the row are padding, not
    attended; rotary positions count from cache_leftpad[b].
    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2) in q's dtype or float32, seqlen_ro at
    least the cache's capacity: q and the new k are rotated at positions
    cache_seqlens[b] - cache_leftpad[b] + i; rotary_interleaved=True rotates the pairs
    (2i, 2i + 1) (GPT-J), False the halves (i, i + rotary_dim / 2) (GPT-NeoX). Unlike
    flash-attn, q's positions advance with i whether or not the call is causal (flash-attn puts
    every query of a non-causal, unwindowed call at cache_seqlens[b]); rotary without k/v
    rotates q alone.
    softmax_scale (default 1/sqrt(headdim)), causal, window_size, softcap: as in
    `flash_attn_func`, aligned bottom-right over the seqlen_k = cache_seqlens[b] + seqlen_new -
    cache_leftpad[b] keys sequence b sees. num_splits: 0 lets the GPU path choose how many
    parts the keys are split into (FlashDecoding); n >= 1 forces n. It never changes the result.

    Returns out (like q; written into `out` when given) and, with return_lse=True, (out, lse)
    where lse is (batch, nheads, seqlen_q) float32; a query that sees no key gets out 0 and
    lse -inf. Arrays come back in q's framework on q's device; CUDA work runs on the caller's
    current stream. There is no backward: decoding needs none (as in flash-attn), outputs
    carry no gradient.
    """
    global _FP32_REFUSED, _LAST
    key = _signature(
        q,
        k_cache,
        v_cache,
        k,
        v,
        rotary_cos,
        rotary_sin,
        cache_seqlens,
        cache_batch_idx,
        cache_leftpad,
        block_table,
        out,
    )
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
            and plan[0] in (_backend._usable or _NO_DEVICES)
            and not _check_indices_on_gpu()
        ):
            # --- the hot path: a torch signature already checked and served ------------------
            scale, wl, wr, cap, _, return_lse = _checks.attention_options(
                plan[9], causal, window_size, softmax_scale, softcap, return_lse
            )
            if (
                (rotary_interleaved is not True and rotary_interleaved is not False)
                or type(num_splits) is not int
                or num_splits < 0
            ):
                rotary_interleaved, num_splits = _decode_options(rotary_interleaved, num_splits)
            res = _serve(
                plan, key, (scale, wl, wr, cap, rotary_interleaved, num_splits, return_lse),
                q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                cache_seqlens, cache_batch_idx, cache_leftpad, block_table, out,
            )  # fmt: skip
            return res if return_lse else res[0]

    hq = handler_of(q, "q")
    dq = hq.describe(q, "q")
    hkc, dkc = _describe(k_cache, "k_cache", hq, q, required=True)
    hvc, dvc = _describe(v_cache, "v_cache", hq, q, required=True)
    hk, dk = _describe(k, "k", hq, q)
    hv, dv = _describe(v, "v", hq, q)
    hcos, dcos = _describe(rotary_cos, "rotary_cos", hq, q)
    hsin, dsin = _describe(rotary_sin, "rotary_sin", hq, q)
    seq_int: int | None = None
    if cache_seqlens is None or isinstance(cache_seqlens, _SCALARS):
        hseq, dseq = None, None
    else:
        hseq, dseq = _describe(cache_seqlens, "cache_seqlens", hq, q)
    hbidx, dbidx = _describe(cache_batch_idx, "cache_batch_idx", hq, q)
    hpad, dpad = _describe(cache_leftpad, "cache_leftpad", hq, q)
    hbt, dbt = _describe(block_table, "block_table", hq, q)

    b, sq, h, d, hk_, sn, capacity, _, block_size, rows = _checks.kvcache_memo(
        dq,
        dkc,
        dvc,
        dk,
        dv,
        dcos,
        dsin,
        dseq,
        dbidx,
        dpad,
        dbt,  # type: ignore[arg-type]
    )
    appends = dk is not None
    if dseq is None:
        if cache_seqlens is None:
            if appends and sn:
                raise ValueError(
                    "cache_seqlens: required when k and v are given (it says where in each "
                    "cache row they are appended)"
                )
            seq_int = capacity - sn
        else:
            seq_int = _checks.cache_seqlens_int(cache_seqlens, sn, capacity)
    if appends:
        for arg, x, hx in (("k_cache", k_cache, hkc), ("v_cache", v_cache, hvc)):
            assert hx is not None
            if not hx.always_writable:
                _checks.writable(arg, x, hx)

    scale, wl, wr, cap, _, return_lse = _checks.attention_options(
        d, causal, window_size, softmax_scale, softcap, return_lse
    )
    rotary_interleaved, splits = _decode_options(rotary_interleaved, num_splits)

    ho: Handler | None = None
    do: Desc | None = None
    if out is not None:
        ho = handler_of(out, "out")
        do = ho.describe(out, "out")
        _checks.out_like("out", out, ho, do, dq[1], dq[3], "q", dq, "(like q)")
        _checks.contiguous_last("out", do, "headdim")

    a = _Call(
        q=(q, hq, dq),
        k_cache=(k_cache, hkc, dkc),
        v_cache=(v_cache, hvc, dvc),
        k=(k, hk, dk) if sn else None,
        v=(v, hv, dv) if sn else None,
        cos=(rotary_cos, hcos, dcos) if dcos is not None else None,
        sin=(rotary_sin, hsin, dsin) if dsin is not None else None,
        seq=(cache_seqlens, hseq, dseq) if dseq is not None else None,
        seq_int=seq_int,
        bidx=(cache_batch_idx, hbidx, dbidx) if dbidx is not None else None,
        pad=(cache_leftpad, hpad, dpad) if dpad is not None else None,
        bt=(block_table, hbt, dbt) if dbt is not None else None,
        dims=(b, sq, h, sn, capacity, block_size, rows),
        options=(scale, wl, wr, cap, rotary_interleaved, splits),
    )

    if b == 0:
        res = _empty_result(a, out, ho)
    elif dq[4] == CUDA:
        reason = _gpu_refusal(dq)
        if reason is None:
            try:
                res = _on_gpu(a, out, do, ho, return_lse)
                if key is not None:
                    _checks.remember(_PLANS, key, _plan(a, hq))
            except _backend.UnsupportedError as exc:
                if dq[3] != "float32":
                    raise
                _FP32_REFUSED = str(exc)
                reason = f"the native core does not serve float32 ({exc})"
        if reason is not None:
            _backend.on_fallback(_OP, reason, depth=1)
            res = _on_host(a, out, ho)
    elif dq[4] == CPU:
        res = _on_host(a, out, ho)
    else:  # pragma: no cover - rejected by the checks
        raise ValueError(f"q: unsupported device type {dq[4]}")
    return res if return_lse else res[0]


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------

# (the array, its handler, its descriptor)
_Arg = tuple[Any, Handler, Desc]


class _Call:
    """One call's checked arguments: each array as (array, handler, descriptor) or None."""

    __slots__ = (
        "bidx",
        "bt",
        "cos",
        "dims",
        "k",
        "k_cache",
        "options",
        "pad",
        "q",
        "seq",
        "seq_int",
        "sin",
        "v",
        "v_cache",
    )

    def __init__(self, **kw: Any) -> None:
        for name, value in kw.items():
            setattr(self, name, value)


def _decode_options(rotary_interleaved: Any, num_splits: Any) -> tuple[bool, int]:
    """The decode call's own options, checked (the attention options are
    `_checks.attention_options`'): (rotary_interleaved, num_splits)."""
    rotary_interleaved = _checks.flag("rotary_interleaved", rotary_interleaved)
    return rotary_interleaved, _checks.nonnegative_int("num_splits", num_splits)


def _signature(*arrays: Any) -> tuple[Any, ...] | None:
    """The plan key of a call whose arrays (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
    cache_seqlens, cache_batch_idx, cache_leftpad, block_table, out; None where not given) are
    all torch tensors: each one's (shape, strides, dtype, device). cache_seqlens may be left
    out when nothing is appended (every cache slot is a key: transformers' decode steps). None
    when one is not a torch tensor (cache_seqlens given as an int included) or has no strides:
    the general path then serves (and says what is wrong)."""
    seqlens = arrays[7]
    if type(seqlens) not in TORCH_TYPES and (seqlens is not None or arrays[3] is not None):
        return None
    key = []
    try:
        for t in arrays:
            if t is None:
                key.append(None)
            elif type(t) in TORCH_TYPES:
                key.append((t.shape, t.stride(), t.dtype, t.device))
            else:
                return None
    except Exception:  # no strides (sparse, nested...)
        return None
    return tuple(key)


def _plan(a: _Call, hq: Handler) -> tuple[Any, ...]:
    """What the hot path needs for a torch signature the general path just served on the GPU:
    (device, dtype name of each of the 12 arrays or None, out's shape and contiguous strides,
    lse's, the stream lookup, torch.float32, seqlen_new, the head dim, rotary given, the cache
    capacity)."""
    q, _, dq = a.q
    b, sq, h, sn, _, _, _ = a.dims
    d = dq[1][3]
    slots = (a.q, a.k_cache, a.v_cache, a.k, a.v, a.cos, a.sin, a.seq, a.bidx, a.pad, a.bt)
    names = tuple(None if x is None else x[2][3] for x in slots) + (dq[3],)
    return (
        dq[5],
        names,
        (b, sq, h, d),
        (sq * h * d, h * d, d, 1),
        (b, h, sq),
        (h * sq, sq, 1),
        hq.current_stream,  # type: ignore[attr-defined]
        hq.float32,  # type: ignore[attr-defined]
        sn,
        d,
        a.cos is not None,
        a.dims[4],
    )


def _serve(
    plan: tuple[Any, ...], key: tuple[Any, ...], opts: tuple[Any, ...], *arrays: Any
) -> tuple[Any, Any]:
    """The hot path's native calls for torch tensors of signature `key` (arrays in the
    `_signature` order): append (and rotate) when k/v or rotary are given, then attend."""
    dev, names, o_shape, o_strides, l_shape, l_strides, current_stream, f32, sn, _, rot, cap_k = (
        plan
    )
    scale, wl, wr, cap, interleaved, splits, return_lse = opts
    stream = current_stream(dev)
    desc = [
        None if t is None else (t.data_ptr(), sig[0], sig[1], name, CUDA, dev)
        for t, sig, name in zip(arrays, key, names)
    ]
    q = arrays[0]
    q_att = desc[0]
    seqlens, k_add = desc[7], sn
    if seqlens is None:
        # no cache_seqlens (nothing appended): every slot is a key, as zeros + capacity
        seqlens, k_add = _zero_lengths(q, o_shape[0], dev), cap_k
    if sn or rot:
        q_rot = qr = None
        if rot:
            q_rot = q.new_empty_strided(o_shape, o_strides)
            qr = (q_rot.data_ptr(), o_shape, o_strides, names[0], CUDA, dev)
        _native.kvcache_append(  # type: ignore[union-attr]
            desc[3], desc[4], desc[1], desc[2], desc[7], desc[8], desc[9], desc[10],
            desc[5], desc[6], interleaved, q_att if rot else None, qr, stream,
        )  # fmt: skip
        if rot:
            q_att = qr
    out = arrays[11]
    if out is None:
        out = q.new_empty_strided(o_shape, o_strides)
        oa = (out.data_ptr(), o_shape, o_strides, names[0], CUDA, dev)
    else:
        oa = desc[11]
    lse = la = None
    if return_lse:
        lse = q.new_empty_strided(l_shape, l_strides, dtype=f32)
        la = (lse.data_ptr(), l_shape, l_strides, "float32", CUDA, dev)
    _native.flash_attn_kvcache(  # type: ignore[union-attr]
        q_att, desc[1], desc[2], oa, la, seqlens, desc[8], desc[9], desc[10],
        scale, wl, wr, cap, splits, stream, k_add,
    )  # fmt: skip
    return out, lse


# (device, batch) -> a device int32 array of zeros and its descriptor: the cache_seqlens of the
# hot path's calls that give none. Read-only for the kernels; made once, outside any capture.
_ZEROS: dict[tuple[int, int], tuple[Any, tuple[Any, ...]]] = {}
# zeros made while a CUDA graph was being captured: their fill is a node of that graph (it
# runs at replay, not now), so they serve that capture only and live as long as the process
_CAPTURED_ZEROS: list[Any] = []


def _zero_lengths(q: Any, batch: int, dev: int) -> tuple[Any, ...]:
    got = _ZEROS.get((dev, batch))
    if got is None:
        import torch

        t = torch.zeros(batch, dtype=torch.int32, device=q.device)
        got = (t, (t.data_ptr(), (batch,), (1,), "int32", CUDA, dev))
        if torch.cuda.is_current_stream_capturing():
            _CAPTURED_ZEROS.append(t)
        else:
            _ZEROS[(dev, batch)] = got
    return got[1]


def _describe(
    x: Any, arg: str, hq: Handler, q: Any, required: bool = False
) -> tuple[Handler | None, Desc | None]:
    if x is None and not required:
        return None, None
    h = hq if type(x) is type(q) else handler_of(x, arg)
    return h, h.describe(x, arg)


def _gpu_refusal(dq: Desc) -> str | None:
    """Why CUDA arrays on q's device cannot run on the GPU here, or None when they can."""
    if dq[5] not in _backend.usable_devices():
        return _backend.device_reason(dq[5])
    if _native is None or not hasattr(_native, "flash_attn_kvcache"):
        return (
            "this build of flashscan._native has no flash_attn_kvcache kernel (it predates "
            "the decode kernels; install a newer flashscan)"
        )
    if dq[3] == "float32" and _FP32_REFUSED is not None:
        return f"the native core does not serve float32 ({_FP32_REFUSED})"
    return None


def _check_indices_on_gpu() -> bool:
    """FLASHSCAN_CHECK_INDICES=1: read the GPU's index tensors on the host and check them
    (a host synchronisation per call; not for CUDA graphs)."""
    raw = os.environ.get("FLASHSCAN_CHECK_INDICES", "").strip().lower()
    return raw not in ("", "0", "false", "no", "off")


def _host(x: _Arg | None) -> np.ndarray | None:
    return None if x is None else x[1].to_host(x[0])


def _check_values(a: _Call, lens: np.ndarray, pad: Any, bidx: Any, bt: Any) -> None:
    b, sq, _, sn, capacity, block_size, rows = a.dims
    seqlen_ro = None if a.cos is None else int(a.cos[2][1][0])
    _checks.kvcache_values(lens, sn, sq, capacity, pad, bidx, rows, bt, block_size, seqlen_ro)


# ---------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------


def _empty_result(a: _Call, out: Any, ho: Handler | None) -> tuple[Any, Any]:
    """batch 0: nothing to append or attend."""
    q, hq, dq = a.q
    _, sq, h, _, _, _, _ = a.dims
    if out is None:
        out = hq.from_host(np.empty(dq[1], np.float32), dq[3], q, dq)
    lse = hq.from_host(np.empty((0, h, sq), np.float32), "float32", q, dq)
    return out, lse


def _on_gpu(
    a: _Call, out: Any, do: Desc | None, ho: Handler | None, return_lse: bool
) -> tuple[Any, Any]:
    """The native decode kernels on the caller's stream (lse None unless return_lse)."""
    q, hq, dq = a.q
    b, sq, h, sn, _, _, _ = a.dims
    scale, wl, wr, cap, interleaved, splits = a.options
    if _check_indices_on_gpu():
        lens = _host(a.seq) if a.seq is not None else np.full(b, a.seq_int, np.int64)
        _check_values(a, lens, _host(a.pad), _host(a.bidx), _host(a.bt))  # type: ignore[arg-type]

    def arg(x: _Arg | None) -> Any:
        if x is None:
            return None
        return x[2] if x[1].fast else x[0]

    # Arrays made here for the kernels: a descriptor does not own its memory, so each one is
    # kept alive until the launches are queued (else the allocator hands its memory to the
    # next allocation of this call, and the kernels read it as another array).
    keep: list[Any] = []

    def index(n: int) -> Any:
        """n for every sequence, an int32 array on q's device."""
        t = hq.from_host(np.full(b, n, np.int32), "int32", q, dq)
        keep.append(t)
        return arg((t, hq, hq.describe(t, "cache_seqlens")))

    stream = hq.stream(dq[5])
    # the attention sees cache_seqlens + seqlen_new keys: the kernel adds sn itself
    seq = index(a.seq_int) if a.seq is None else arg(a.seq)  # type: ignore[arg-type]

    q_att = arg(a.q)
    if a.k is not None or a.cos is not None:
        q_rot = None
        if a.cos is not None:
            rotated, q_rot = new_output(hq, dq[1], dq[3], q, dq)
            keep.append(rotated)
        _native.kvcache_append(  # type: ignore[union-attr]
            arg(a.k),
            arg(a.v),
            arg(a.k_cache),
            arg(a.v_cache),
            seq,
            arg(a.bidx),
            arg(a.pad),
            arg(a.bt),
            arg(a.cos),
            arg(a.sin),
            interleaved,
            q_att if q_rot is not None else None,
            q_rot,
            stream,
        )
        if q_rot is not None:
            q_att = q_rot

    out, oa, lse, la = out_and_lse(hq, q, dq, out, ho, do, (b, h, sq) if return_lse else None)
    _native.flash_attn_kvcache(  # type: ignore[union-attr]
        q_att,
        arg(a.k_cache),
        arg(a.v_cache),
        oa,
        la,
        seq,
        arg(a.bidx),
        arg(a.pad),
        arg(a.bt),
        scale,
        wl,
        wr,
        cap,
        splits,
        stream,
        sn,
    )
    return finished(hq, out, lse)


def _on_host(a: _Call, out: Any, ho: Handler | None) -> tuple[Any, Any]:
    """The reference on host arrays (CPU arrays, the fallback); caches written back in place."""
    q, hq, dq = a.q
    b, _, _, sn, _, _, _ = a.dims
    scale, wl, wr, cap, interleaved, splits = a.options
    lens = _host(a.seq) if a.seq is not None else np.full(b, a.seq_int, np.int64)
    pad, bidx, bt = _host(a.pad), _host(a.bidx), _host(a.bt)
    _check_values(a, lens, pad, bidx, bt)  # type: ignore[arg-type]
    kc, vc = _host(a.k_cache), _host(a.v_cache)
    o, lse = reference_kvcache.flash_attn_with_kvcache(
        _host(a.q),  # type: ignore[arg-type]
        kc,  # type: ignore[arg-type]
        vc,  # type: ignore[arg-type]
        _host(a.k),
        _host(a.v),
        _host(a.cos),
        _host(a.sin),
        lens,
        bidx,
        pad,
        bt,
        softmax_scale=scale,
        window_size=(wl, wr),
        softcap=cap,
        rotary_interleaved=interleaved,
        num_splits=splits,
        return_lse=True,
    )
    if a.k is not None:
        # NumPy (and torch CPU) caches were updated in place through their host views; the
        # handlers skip those copies. Other caches (GPU, bfloat16) get the update here.
        a.k_cache[1].copy_into(a.k_cache[0], kc)
        a.v_cache[1].copy_into(a.v_cache[0], vc)
    if out is None:
        out = hq.from_host(o, dq[3], q, dq)
    else:
        assert ho is not None
        ho.copy_into(out, o)
    return out, hq.from_host(lse, "float32", q, dq)
