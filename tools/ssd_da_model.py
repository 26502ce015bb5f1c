#!/usr/bin/env python3
"""The SSD backward's intra-chunk da as a 64 x 64 block computation: the plan for a GPU kernel
that forms it without cancellation, replayed in NumPy (no GPU).

The backward's gradient of the increments a_k = dt'_k A inside a chunk gets, from the
intra-chunk term y_l += sum_{s<=l} CB[l,s] exp(cum_l - cum_s) dt'_s x_s (per head),
    da_k = sum_{l >= k > s} r[l, s],   r[l, s] = (g_l . x_s) CB[l,s] decay(l,s) dt'_s
(`flashscan.reference_ssd.straddle_sums`). Today's CUDA path forms it as the reverse cumulative
sum of R_l - dt'_l X1_l (row sums minus column sums of r), which nearly cancel, so its products
run in 3xTF32 (`cuda/ssd_bwd.cu`). Every term of the straddle sum enters once with its own sign:
fp32 accumulation of fp32 (or tf32-rounded) r stays within a few ulp of sum |r|.

A kernel that already holds r's 64 x 64 blocks (ssd_bwd_cb_dcb forms dCB[l,s] = (g_l . x_s)
decay dt'_s per head, and has CB) adds, per head and lower block (Li, Si), Li >= Si:
  Li > Si:  colsum[s] = sum_l r[l, s] and rowsum[l] = sum_s r[l, s] of the block, and its total:
            k in Si gets the exclusive prefix of colsum below k, k in a block strictly between Si
            and Li gets the total, k in Li gets the inclusive suffix of rowsum from k;
  Li == Si: the straddle sum inside the block: t[l, k] = sum_{s<k} r[l, s] (exclusive row
            prefix, a shared-memory scan), then sum over rows l >= k.
Per (chunk, head) that is 64-long scans and sums only (no q x q scratch beyond one block), and
the order of every sum is fixed, so the result is deterministic.

Wiring it into cuda/ssd_bwd.cu (the plan, as built on 2026-11-27 with two changes: CB has its
own launch, ssd_bwd_cb, so that every head share of ssd_bwd_dcb reads it; each record holds the
raw column and row sums, and ssd_bwd_dt takes their prefixes, suffixes and totals (straddle_da);
R_state comes from chunk_dc2's state term):
  1. ssd_bwd_cb_dcb, per head of its share, after the dw = g x^T tile: r = dw * exp(cum_l - cum_s)
     * dt'_s * CB * mask (CB is in share 0's accumulators; other shares need it too: recompute it
     per CTA, or split the CB product into its own launch first). Row sums: in-thread over the 8
     column tiles, then quad_sum; column sums: across the 4 warps' 16-row slices in shared memory;
     the diagonal block: r to shared memory, a per-row exclusive scan over s, a column sum over
     rows l >= k. Write per (batch, head, chunk, block pair) the 64 column-prefix values (k in Si),
     the 64 row-suffix values (k in Li) and the total: (kQ/64)(kQ/64+1)/2 * 129 floats of scratch
     per (batch, head, chunk).
  2. ssd_bwd_dt (one warp per (chunk, head)) adds, per position, the pair partials in a fixed
     order (deterministic) to the reverse cumsum of the stable terms: e_l g_l . (C_l H_c), df_c f_c
     at the chunk end, and the state-out term as the prefix sum over s < k of dt'_s X2_s.
  3. With R_l (intra part) and X1 gone from da, ddt'_k = X1_k + X2_k + A da_k has no cancellation:
     chunk_out2 keeps y_pre only for dz and the carried-state R, chunk_dx2 keeps X1 for ddt; both
     can drop 3xTF32 (1xTF32 measured 2026-11-24: 3.56 / 2.79 ms vs 4.15 / 3.92 ms at b8 L2048),
     then take 16-bit operands as ssd_fwd2 does.

`kernel_records` / `kernel_assemble` below replay that split as built (the records of
ssd_bwd_dcb, the assembly of ssd_bwd_dt's straddle_da); tests/test_ssd_da_model.py checks both
forms against the reference.

    python tools/ssd_da_model.py          # checks the block form against the reference
"""

from __future__ import annotations

import sys

import numpy as np

BLOCK = 64


def block_straddle(r: np.ndarray, block: int = BLOCK, dtype: type = np.float64) -> np.ndarray:
    """da (q, h) from r (q, q, h) (zero above the diagonal and across sequence resets) by the
    block recipe above, accumulating in `dtype` (float32: what the kernel would do)."""
    q, _, h = r.shape
    r = r.astype(dtype)
    nb = -(-q // block)
    da = np.zeros((q, h), dtype)
    for li in range(nb):
        l0, l1 = li * block, min(q, (li + 1) * block)
        for si in range(li + 1):
            s0, s1 = si * block, min(q, (si + 1) * block)
            blk = r[l0:l1, s0:s1]  # (rows l, cols s, h)
            if li == si:
                t = np.cumsum(blk, axis=1, dtype=dtype) - blk  # exclusive prefix over s
                keep = np.tril(np.ones((l1 - l0, s1 - s0), bool))[..., None]
                da[l0:l1] += np.where(keep, t, 0).sum(axis=0, dtype=dtype)
                continue
            colsum = blk.sum(axis=0, dtype=dtype)  # (s, h)
            rowsum = blk.sum(axis=1, dtype=dtype)  # (l, h)
            total = colsum.sum(axis=0, dtype=dtype)
            da[s0:s1] += np.cumsum(colsum, axis=0, dtype=dtype) - colsum  # k in Si: s < k
            da[s1:l0] += total  # k strictly between the two blocks
            da[l0:l1] += np.flip(np.cumsum(np.flip(rowsum, 0), axis=0, dtype=dtype), 0)  # l >= k
    return da


def kernel_records(r: np.ndarray, length: int, block: int = BLOCK) -> np.ndarray:
    """What ssd_bwd_dcb's straddle_record writes for one head of one chunk: r (q, q), q the chunk
    size, zero above the diagonal, across resets and at rows / columns >= length. Returns
    (pairs, 2 block) records, pair (i, j) at i (i + 1) / 2 + j for every lower block pair of the
    chunk; pairs whose row block starts at or past `length` stay NaN (never written). Off the
    diagonal: [column sums over the block's rows | row sums over its columns]; on it: the
    in-block straddle sums sum_{l >= k > s} r[l, s] in the first half."""
    q = r.shape[0]
    nb = q // block
    rec = np.full((nb * (nb + 1) // 2, 2 * block), np.nan)
    for i in range(nb):
        if i * block >= length:
            continue
        for j in range(i + 1):
            blk = r[i * block : (i + 1) * block, j * block : (j + 1) * block]
            out = rec[i * (i + 1) // 2 + j]
            if i == j:
                pre = np.cumsum(blk, axis=1) - blk  # P[l, k] = sum_{s < k} r[l, s]
                out[:block] = np.where(np.tril(np.ones_like(blk, bool)), pre, 0.0).sum(axis=0)
            else:
                out[:block] = blk.sum(axis=0)
                out[block:] = blk.sum(axis=1)
    return rec


def kernel_assemble(rec: np.ndarray, q: int, length: int, block: int = BLOCK) -> np.ndarray:
    """ssd_bwd_dt's straddle_da over those records: da (q,) at the positions < length. For k in
    block bk: the diagonal record, the exclusive prefix inside bk of the column sums of the
    blocks (li > bk, bk), the inclusive suffix inside bk of the row sums of the blocks (bk, sj <
    bk), and the totals of the blocks (li, sj) with sj < bk < li. Records of blocks at or past
    `length` are not read (they hold NaN here, so reading one would show)."""
    nb = -(-length // block)
    at = lambda i, j: rec[i * (i + 1) // 2 + j]  # noqa: E731
    da = np.zeros(q)
    for bk in range(nb):
        col = sum((at(li, bk)[:block] for li in range(bk + 1, nb)), np.zeros(block))
        row = sum((at(bk, sj)[block:] for sj in range(bk)), np.zeros(block))
        between = sum(
            at(li, sj)[:block].sum() for li in range(nb) for sj in range(li - 1) if sj < bk < li
        )
        da[bk * block : (bk + 1) * block] = (
            at(bk, bk)[:block] + between + (np.cumsum(col) - col) + np.flip(np.cumsum(np.flip(row)))
        )
    da[length:] = 0.0
    return da


def random_r(q: int, h: int, seed: int, resets: int = 0) -> np.ndarray:
    """A random r (q, q, h) with the mask of a chunk: l >= s, same segment (`resets` sequence
    starts at random positions), large cancelling magnitudes as real chunks have."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((q, q, h)) * np.exp(rng.uniform(-3, 3, (q, 1, 1)))
    seg = np.zeros(q, np.int64)
    for p in rng.choice(np.arange(1, q), size=min(resets, q - 1), replace=False):
        seg[p:] += 1
    mask = np.tril(np.ones((q, q), bool)) & (seg[:, None] == seg[None, :])
    return np.where(mask[..., None], r, 0.0)


def main() -> int:
    sys.path.insert(0, "python")
    from flashscan.reference_ssd import straddle_sums

    worst = 0.0
    for q in (1, 37, 64, 100, 128, 200, 256):
        for resets in (0, 3):
            r = random_r(q, 3, seed=q + resets, resets=resets)
            ref = straddle_sums(r[None])[0]
            got = block_straddle(r)
            worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(r).sum(), 1e-300)))
    print(f"block form vs reference, float64: max error / sum|r| = {worst:.2e}")
    return 0 if worst < 1e-13 else 1


if __name__ == "__main__":
    sys.exit(main())
