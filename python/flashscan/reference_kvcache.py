"""NumPy reference of `flash_attn_with_kvcache`: decode attention against a KV cache that the
call updates in place.

The semantics are flash-attn's, as the contract between the Python layer and the native core
states them (see `kvcache.py` for the public function and its checks):

1. append: k/v (batch, seqlen_new, nheads_k, headdim) are written into batch b's cache row at
   positions cache_seqlens[b] + i, through `block_table` when the cache is paged; k gets the
   rotary embedding (when rotary_cos/sin are given) at position cache_seqlens[b] - leftpad[b] + i.
2. q is rotated at positions cache_seqlens[b] - leftpad[b] + i (i < seqlen_q), causal or not
   (flash-attn puts every query of a non-causal, unwindowed call at cache_seqlens[b]; the
   contract with the native core does not), rounded to q's dtype (the native core writes the
   rotated q into an array like q).
3. attention of each sequence's queries over its cache positions [leftpad[b], seqlens_k[b]),
   seqlens_k = cache_seqlens + seqlen_new, by `reference.flash_attn_func` (one masked online
   softmax for every attention in the package): causal / window bottom-right aligned over those
   seqlens_k[b] - leftpad[b] keys, softcap, GQA; a query that sees no key gets out 0, lse -inf.

Computes in float64; the caches keep their dtype (the appended values are rounded to it, and
attention reads them back from the cache, as the GPU does). Like `reference.py`, it checks
nothing beyond what the math needs: the public API validates shapes and index values.
"""

from __future__ import annotations

import math

import numpy as np

from .reference import flash_attn_func

__all__ = ["apply_rotary", "flash_attn_with_kvcache"]

_Array = np.ndarray
_F64 = np.dtype(np.float64)


def apply_rotary(
    x: _Array, cos: _Array, sin: _Array, positions: _Array, interleaved: bool
) -> _Array:
    """x (n, heads, headdim) rotated at `positions` (n,) by cos/sin (seqlen_ro, rotary_dim / 2),
    in float64; dimensions from rotary_dim on are copied unchanged.

    interleaved=True (GPT-J): the pairs (2i, 2i + 1); False (GPT-NeoX): the halves
    (i, i + rotary_dim / 2). A pair (a, b) becomes (a cos - b sin, a sin + b cos)."""
    half = cos.shape[1]
    rd = 2 * half
    c = cos[positions].astype(_F64)[:, None, :]  # (n, 1, rotary_dim / 2)
    s = sin[positions].astype(_F64)[:, None, :]
    y = np.array(x, dtype=_F64)
    if interleaved:
        a, b = y[..., 0:rd:2].copy(), y[..., 1:rd:2].copy()
        y[..., 0:rd:2] = a * c - b * s
        y[..., 1:rd:2] = a * s + b * c
    else:
        a, b = y[..., :half].copy(), y[..., half:rd].copy()
        y[..., :half] = a * c - b * s
        y[..., half:rd] = a * s + b * c
    return y


def flash_attn_with_kvcache(
    q: _Array,
    k_cache: _Array,
    v_cache: _Array,
    k: _Array | None = None,
    v: _Array | None = None,
    rotary_cos: _Array | None = None,
    rotary_sin: _Array | None = None,
    cache_seqlens: int | _Array | None = None,
    cache_batch_idx: _Array | None = None,
    cache_leftpad: _Array | None = None,
    block_table: _Array | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    num_splits: int = 0,
    return_lse: bool = False,
) -> _Array | tuple[_Array, _Array]:
    """flash-attn's `flash_attn_with_kvcache` on NumPy arrays; k_cache / v_cache are updated IN
    PLACE when k / v are given.

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache,
    nheads_k, headdim), or paged (num_blocks, block_size, nheads_k, headdim) with block_table
    (batch, max_blocks) naming the block that holds positions [j * block_size, (j + 1) *
    block_size) of sequence b. k, v: (batch, seqlen_new, nheads_k, headdim) or None.
    cache_seqlens: an int or (batch,) ints, the valid tokens of each cache row BEFORE the append
    (None: the whole capacity). cache_batch_idx (batch,): the cache row of each sequence
    (contiguous caches; default b). cache_leftpad (batch,): slots [0, leftpad[b]) of the row are
    padding. rotary_cos / rotary_sin: (seqlen_ro, rotary_dim / 2).

    num_splits changes how the GPU divides the work, not the result: it is ignored here.
    Returns out like q (q's dtype) and, with return_lse, lse (batch, nheads, seqlen_q) float32.
    """
    del num_splits
    batch, seqlen_q, nheads, headdim = q.shape
    paged = block_table is not None
    if paged:
        assert block_table is not None
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
    else:
        capacity = k_cache.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]

    if cache_seqlens is None:
        lens = np.full(batch, capacity, dtype=np.int64)
    elif np.ndim(cache_seqlens) == 0:
        lens = np.full(batch, int(cache_seqlens), dtype=np.int64)  # type: ignore[arg-type]
    else:
        lens = np.asarray(cache_seqlens, dtype=np.int64)
    pad = np.zeros(batch, np.int64) if cache_leftpad is None else cache_leftpad.astype(np.int64)
    rows = np.arange(batch) if cache_batch_idx is None else cache_batch_idx.astype(np.int64)

    def slots(b: int, positions: _Array) -> tuple[_Array, _Array]:
        """Indices into the cache's first two axes of sequence b's `positions`."""
        if paged:
            assert block_table is not None
            return block_table[b, positions // block_size].astype(np.int64), positions % block_size
        return np.full(positions.shape, rows[b]), positions

    rotary = rotary_cos is not None
    if rotary:
        assert rotary_sin is not None

    # 1. append the new keys (rotated) and values
    if k is not None and seqlen_new:
        assert v is not None
        for b in range(batch):
            positions = lens[b] + np.arange(seqlen_new)
            kb = k[b].astype(_F64)
            if rotary:
                kb = apply_rotary(
                    kb, rotary_cos, rotary_sin, positions - pad[b], rotary_interleaved
                )
            blk, off = slots(b, positions)
            k_cache[blk, off] = kb  # rounded to the cache's dtype
            v_cache[blk, off] = v[b]

    # 2. the rotated queries, rounded to q's dtype as the GPU path stores them
    qf = q.astype(_F64)
    if rotary:
        for b in range(batch):
            positions = lens[b] - pad[b] + np.arange(seqlen_q)
            qf[b] = apply_rotary(qf[b], rotary_cos, rotary_sin, positions, rotary_interleaved)
        qf = qf.astype(q.dtype).astype(_F64)

    # 3. attention over each sequence's valid keys, read back from the cache
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    out = np.empty((batch, seqlen_q, nheads, headdim), dtype=q.dtype)
    lse = np.empty((batch, nheads, seqlen_q), dtype=np.float32)
    seqlens_k = lens + seqlen_new
    for b in range(batch):
        blk, off = slots(b, np.arange(pad[b], seqlens_k[b]))
        o, lse_b = flash_attn_func(
            qf[b : b + 1],
            k_cache[blk, off].astype(_F64)[None],
            v_cache[blk, off].astype(_F64)[None],
            softmax_scale=scale,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            return_lse=True,
            accum_dtype=_F64,
        )
        out[b] = o[0]
        lse[b] = lse_b[0]
    return (out, lse) if return_lse else out
