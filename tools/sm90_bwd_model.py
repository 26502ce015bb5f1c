#!/usr/bin/env python3
"""A NumPy model of cuda/flash_bwd_sm90.cu's index math, run on the CPU (no GPU needed).

It replays the kernel's shared-memory traffic byte for byte: tiles stored through the kernel's
swz_offset, the wgmma operands fetched through the descriptors the kernel builds (start address,
LBO, SBO, 128-byte swizzle, K-major or MN-major by the transpose bits), the register A operand
and the accumulators through the per-thread fragment layouts of common/wgmma.cuh, the masks, the
dQ blocks in fragment order and the convert pass that reads them back, for every CTA and every
iteration of a small problem; then compares dq, dk, dv with a float64 reference.

What it rests on (and cannot prove): the hardware's reading of a descriptor. The model reads a
K-major operand row r, k-element k at start + (r / 8) SBO + (r % 8) 128 + 2 k and an MN-major one
(element mn, k) at start + (mn / 64) LBO + (k / 8) SBO + (k % 8) 128 + 2 (mn % 64), both passed
through the 128-byte swizzle (address bits [4:6] ^= [7:9]). `check_forward_descriptors` shows the
model reads the GPU-verified forward (cuda/flash_fwd_sm90.cu: Q K^T K-major, P V with V MN-major)
correctly; the backward's transposed-A read of dS (dQ = dS K) relies on MN-major A being read
like MN-major B, as the PTX ISA describes the two operands' canonical layouts alike.

    python tools/sm90_bwd_model.py          # a few shapes, prints the errors
"""

from __future__ import annotations

import sys

import numpy as np

LOG2E = 1.4426950408889634


# ---- shared memory -------------------------------------------------------------------------------
def sw(addr: np.ndarray) -> np.ndarray:
    """The 128-byte swizzle on a (1024-aligned-base) byte address."""
    return addr ^ (((addr >> 7) & 7) << 4)


def swz_offset(rows: int, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """common/wgmma.cuh's swz_offset, element (row, col) of a swizzled tile of `rows` rows."""
    block, chunk = col >> 6, (col >> 3) & 7
    return block * rows * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + (col & 7) * 2


class Smem:
    """Shared memory as 16-bit elements (values kept as float32 already rounded to the dtype)."""

    def __init__(self, nbytes: int) -> None:
        self.e = np.full(nbytes // 2, np.nan, np.float32)  # unwritten reads show as NaN

    def store(self, byte_addr: np.ndarray, vals: np.ndarray) -> None:
        assert np.all(byte_addr % 2 == 0)
        self.e[byte_addr // 2] = vals

    def load(self, byte_addr: np.ndarray) -> np.ndarray:
        return self.e[byte_addr // 2]


def fetch_kmajor(sm: Smem, start: int, sbo: int, rows: int) -> np.ndarray:
    """rows x 16 operand, K contiguous (the kernel's tb0 / A-not-transposed form)."""
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    return sm.load(sw(start + (r // 8) * sbo + (r % 8) * 128 + 2 * k))


def fetch_mnmajor(sm: Smem, start: int, lbo: int, sbo: int, mn: int) -> np.ndarray:
    """mn x 16 operand, MN contiguous (transposed form), returned as [mn][k]."""
    m = np.arange(mn)[:, None]
    k = np.arange(16)[None, :]
    return sm.load(sw(start + (m // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + 2 * (m % 64)))


# ---- fragment layouts ---------------------------------------------------------------------------
def acc_rc(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of accumulator register i of warpgroup thread t, arrays [128][n / 2]."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    warp, lane = t // 32, t % 32
    j, e = i // 4, i % 4
    return 16 * warp + lane // 4 + 8 * (e >> 1), 8 * j + 2 * (lane % 4) + (e & 1)


def gather_acc(d: np.ndarray) -> np.ndarray:
    r, c = acc_rc(d.shape[1])
    return d[r, c]


def a_from_regs(a: np.ndarray) -> np.ndarray:
    """The 64 x 16 A of a register-A wgmma from per-thread a[128][4][2] (the pack2 pairs)."""
    out = np.full((64, 16), np.nan, np.float32)
    t = np.arange(128)
    warp, lane = t // 32, t % 32
    g, q = lane // 4, lane % 4
    for e in range(4):
        row = 16 * warp + g + 8 * (e & 1)
        col = 2 * q + 8 * (e >> 1)
        out[row, col] = a[:, e, 0]
        out[row, col + 1] = a[:, e, 1]
    return out


def rnd(x: np.ndarray, dt: type) -> np.ndarray:
    return np.asarray(x, np.float32).astype(dt).astype(np.float32)


# ---- the kernel -----------------------------------------------------------------------------
def run_cta(
    sm_bytes: int,
    hd: int,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    lse2: np.ndarray,
    dpsum: np.ndarray,
    dq_accum: np.ndarray,
    n_block: int,
    hk: int,
    group: int,
    scale: float,
    window: tuple[int, int],
    dt: type,
) -> tuple[np.ndarray, np.ndarray]:
    """One CTA of flash_bwd_sm90_kernel for batch 0: returns its dK, dV rows; adds into dq_accum
    (heads x seqlen_q_pad x hd). q / do: (seqlen_q, heads, hd), k / v: (seqlen_k, kv heads, hd)."""
    block_n, block_m = 128, (64 if hd == 128 else 128)
    kv_col, q_col = block_n * 128, block_m * 128
    kv_tile, q_tile = block_n * hd * 2, block_m * hd * 2
    k_off, v_off, q_off = 0, kv_tile, 2 * kv_tile
    s_off = q_off + 4 * q_tile
    sm = Smem(sm_bytes)
    sq, sk = q.shape[0], k.shape[0]
    diag = sk - sq
    n0 = n_block * block_n
    keys = min(block_n, sk - n0)
    m_begin, m_end = 0, (sq + block_m - 1) // block_m
    left, right = window
    has_mask = left >= 0 or right >= 0
    if has_mask and right >= 0:
        lo = n0 - diag - right
        if lo > 0:
            m_begin = min(lo // block_m, m_end)
    if has_mask and left >= 0:
        hi = n0 + keys - 1 - diag + left
        m_end = 0 if hi < 0 else min(hi // block_m + 1, m_end)
    nm = max(0, m_end - m_begin)

    def load_tile(dst: int, rows: int, src: np.ndarray, valid: int) -> None:
        r = np.arange(rows)[:, None]
        c = np.arange(hd)[None, :]
        vals = np.zeros((rows, hd), np.float32)
        nv = max(0, min(valid, rows))
        vals[:nv] = src[:nv]
        sm.store(dst + swz_offset(rows, r, c), vals)

    load_tile(k_off, block_n, k[n0 : n0 + block_n, hk], keys)
    load_tile(v_off, block_n, v[n0 : n0 + block_n, hk], keys)
    acc_dk = np.zeros((2, 128, hd // 2), np.float32)
    acc_dv = np.zeros((2, 128, hd // 2), np.float32)
    for it in range(nm * group):
        st = it & 1
        hq = hk * group + it // nm
        m0 = (m_begin + it % nm) * block_m
        sQ = q_off + st * 2 * q_tile
        sdO = sQ + q_tile
        load_tile(sQ, block_m, q[m0 : m0 + block_m, hq], sq - m0)
        load_tile(sdO, block_m, do[m0 : m0 + block_m, hq], sq - m0)
        sL, sD = lse2[hq, m0 : m0 + block_m], dpsum[hq, m0 : m0 + block_m]
        sa_all = []
        for wg in range(2):
            sK_wg, sV_wg = k_off + wg * 64 * 128, v_off + wg * 64 * 128
            s = np.zeros((64, block_m), np.float32)
            dp = np.zeros((64, block_m), np.float32)
            for kk in range(hd // 16):
                kvo = (kk >> 2) * kv_col + (kk & 3) * 32
                qo = (kk >> 2) * q_col + (kk & 3) * 32
                s += (
                    fetch_kmajor(sm, sK_wg + kvo, 1024, 64)
                    @ fetch_kmajor(sm, sQ + qo, 1024, block_m).T
                )
                dp += (
                    fetch_kmajor(sm, sV_wg + kvo, 1024, 64)
                    @ fetch_kmajor(sm, sdO + qo, 1024, block_m).T
                )
            acc_s, acc_dp = gather_acc(s), gather_acc(dp)  # [128][block_m / 2]
            t = np.arange(128)[:, None]
            i = np.arange(block_m // 2)[None, :]
            j, e = i // 4, i % 4
            col = 8 * j + 2 * (t % 32 % 4) + (e & 1)  # sL + 8 j + 2 t, .x / .y
            with np.errstate(over="ignore", invalid="ignore"):
                acc_s = np.exp2(acc_s * np.float32(scale * LOG2E) - sL[col])
            need_mask = n0 + block_n > sk
            if has_mask and right >= 0 and n0 + block_n - 1 - (m0 + diag) > right:
                need_mask = True
            if has_mask and left >= 0 and n0 - (m0 + block_m - 1 + diag) < -left:
                need_mask = True
            if need_mask:  # P^T only: dS^T = P^T (dP^T - D) vanishes with it
                rel_lo = -left if has_mask and left >= 0 else -0x7FFFFFFF
                rel_hi = right if has_mask and right >= 0 else 0x7FFFFFFF
                key_row = wg * 64 + (t // 32) * 16 + (t % 32) // 4
                key = n0 + key_row + 8 * (e >> 1)
                rel = key - (m0 + 2 * (t % 32 % 4) + diag + 8 * j + (e & 1))
                dead = (key >= sk) | (rel < rel_lo) | (rel > rel_hi)
                acc_s = np.where(dead, 0.0, acc_s)
            acc_dp = acc_s * (acc_dp - sD[col])
            # pa[kk][e] = pack2(acc[8 kk + 2 e], acc[8 kk + 2 e + 1])
            pa = rnd(acc_s, dt).reshape(128, block_m // 16, 4, 2)
            sa = rnd(acc_dp, dt).reshape(128, block_m // 16, 4, 2)
            dv_d = np.zeros((64, hd), np.float32)
            dk_d = np.zeros((64, hd), np.float32)
            for kk in range(block_m // 16):
                b_do = fetch_mnmajor(sm, sdO + kk * 16 * 128, q_col, 1024, hd)  # [n][k]
                b_q = fetch_mnmajor(sm, sQ + kk * 16 * 128, q_col, 1024, hd)
                dv_d += a_from_regs(pa[:, kk]) @ b_do.T
                dk_d += a_from_regs(sa[:, kk]) @ b_q.T
            acc_dv[wg] += gather_acc(dv_d)
            acc_dk[wg] += gather_acc(dk_d)
            sa_all.append(sa)
        # dS^T -> shared memory
        for wg in range(2):
            t = np.arange(128)
            key_row = wg * 64 + (t // 32) * 16 + (t % 32) // 4
            for kk in range(block_m // 16):
                for e in range(4):
                    row = key_row + 8 * (e & 1)
                    col = 16 * kk + 8 * (e >> 1) + 2 * (t % 4)
                    a = s_off + swz_offset(block_n, row, col)
                    sm.store(a, sa_all[wg][:, kk, e, 0])
                    sm.store(a + 2, sa_all[wg][:, kk, e, 1])
        # dQ = dS K
        for wg in range(2):
            a_off = wg * block_n * 128 if block_m == 128 else 0
            b_off = wg * kv_col if block_m == 64 else 0
            d = np.zeros((64, 64), np.float32)
            for kk in range(block_n // 16):
                a = fetch_mnmajor(sm, s_off + a_off + kk * 16 * 128, block_n * 128, 1024, 64)
                b = fetch_mnmajor(sm, k_off + b_off + kk * 16 * 128, kv_col, 1024, 64)
                d += a @ b.T
            acc_dq = gather_acc(d)  # [128][32]: thread t of the warpgroup, acc_dq[i]
            # stored in fragment order: warp w = 4 wg + t / 32 writes acc_dq[4 j .. 4 j + 3] as
            # the float4 at ((w 8 + j) 32 + lane) 4 of the block; the bulk reduce adds the
            # whole block (rows past seqlen_q hold zeros) to the accumulator's contiguous block
            t = np.arange(128)[:, None]
            i = np.arange(32)[None, :]
            w, lane = 4 * wg + t // 32, t % 32
            flat = ((w * 8 + i // 4) * 32 + lane) * 4 + i % 4
            block = dq_accum[hq].reshape(-1)[m0 * hd : (m0 + block_m) * hd]  # a view
            np.add.at(block, flat, acc_dq)
    # epilogue: dK * scale, dV staged through the K / V tiles, rows < keys stored
    dk_out = np.zeros((block_n, hd), np.float32)
    dv_out = np.zeros((block_n, hd), np.float32)
    for wg in range(2):
        t = np.arange(128)[:, None]
        i = np.arange(hd // 2)[None, :]
        j, e = i // 4, i % 4
        row = wg * 64 + (t // 32) * 16 + (t % 32) // 4 + 8 * (e >> 1)
        col = 8 * j + 2 * (t % 4) + (e & 1)
        sm.store(k_off + swz_offset(block_n, row, col), rnd(acc_dk[wg] * scale, dt))
        sm.store(v_off + swz_offset(block_n, row, col), rnd(acc_dv[wg], dt))
    r = np.arange(block_n)[:, None]
    c = np.arange(hd)[None, :]
    dk_out[:] = sm.load(k_off + swz_offset(block_n, r, c))
    dv_out[:] = sm.load(v_off + swz_offset(block_n, r, c))
    return dk_out[:keys], dv_out[:keys]


def run_cta_wide(
    sm_bytes: int,
    hd: int,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    lse2: np.ndarray,
    dpsum: np.ndarray,
    dq_accum: np.ndarray,
    n_block: int,
    hk: int,
    group: int,
    scale: float,
    window: tuple[int, int],
    dt: type,
) -> tuple[np.ndarray, np.ndarray]:
    """run_cta for hd256, the kernel's column-split form: 64 keys a CTA, 64 queries a step;
    warpgroup wg computes S^T / dP^T over queries [32 wg, 32 wg + 32) (m64n32), stores P^T and
    dS^T (16-bit) to shared memory, and after the barrier owns dK / dV / dQ columns
    [128 wg, 128 wg + 128): dV += P^T dO and dK += dS^T Q with A from shared memory (K-major),
    dQ = dS K in two m64n64 halves (A transposed from the dS^T tile), added in fragment order."""
    assert hd == 256
    block_n, block_m = 64, 64
    kv_col, q_col = block_n * 128, block_m * 128
    kv_tile, q_tile = block_n * hd * 2, block_m * hd * 2
    k_off, v_off, q_off = 0, kv_tile, 2 * kv_tile
    s_off = q_off + 4 * q_tile
    p_off = s_off + block_n * block_m * 2
    sm = Smem(sm_bytes)
    sq, sk = q.shape[0], k.shape[0]
    diag = sk - sq
    n0 = n_block * block_n
    keys = min(block_n, sk - n0)
    m_begin, m_end = 0, (sq + block_m - 1) // block_m
    left, right = window
    has_mask = left >= 0 or right >= 0
    if has_mask and right >= 0:
        lo = n0 - diag - right
        if lo > 0:
            m_begin = min(lo // block_m, m_end)
    if has_mask and left >= 0:
        hi = n0 + keys - 1 - diag + left
        m_end = 0 if hi < 0 else min(hi // block_m + 1, m_end)
    nm = max(0, m_end - m_begin)

    def load_tile(dst: int, rows: int, src: np.ndarray, valid: int) -> None:
        r = np.arange(rows)[:, None]
        c = np.arange(hd)[None, :]
        vals = np.zeros((rows, hd), np.float32)
        nv = max(0, min(valid, rows))
        vals[:nv] = src[:nv]
        sm.store(dst + swz_offset(rows, r, c), vals)

    load_tile(k_off, block_n, k[n0 : n0 + block_n, hk], keys)
    load_tile(v_off, block_n, v[n0 : n0 + block_n, hk], keys)
    acc_dk = np.zeros((2, 128, 64), np.float32)
    acc_dv = np.zeros((2, 128, 64), np.float32)
    t = np.arange(128)[:, None]
    key_row = (t // 32) * 16 + (t % 32) // 4  # the same 64 keys in both warpgroups
    for it in range(nm * group):
        st = it & 1
        hq = hk * group + it // nm
        m0 = (m_begin + it % nm) * block_m
        sQ = q_off + st * 2 * q_tile
        sdO = sQ + q_tile
        load_tile(sQ, block_m, q[m0 : m0 + block_m, hq], sq - m0)
        load_tile(sdO, block_m, do[m0 : m0 + block_m, hq], sq - m0)
        sL, sD = lse2[hq, m0 : m0 + block_m], dpsum[hq, m0 : m0 + block_m]
        for wg in range(2):  # S^T, dP^T, P^T, dS^T of this warpgroup's 32 queries
            q_col0 = 32 * wg
            s = np.zeros((64, 32), np.float32)
            dp = np.zeros((64, 32), np.float32)
            for kk in range(hd // 16):
                kvo = (kk >> 2) * kv_col + (kk & 3) * 32
                qo = (kk >> 2) * q_col + (kk & 3) * 32
                s += (
                    fetch_kmajor(sm, k_off + kvo, 1024, 64)
                    @ fetch_kmajor(sm, sQ + q_col0 * 128 + qo, 1024, 32).T
                )
                dp += (
                    fetch_kmajor(sm, v_off + kvo, 1024, 64)
                    @ fetch_kmajor(sm, sdO + q_col0 * 128 + qo, 1024, 32).T
                )
            acc_s, acc_dp = gather_acc(s), gather_acc(dp)  # [128][16]
            i = np.arange(16)[None, :]
            j, e = i // 4, i % 4
            col = q_col0 + 8 * j + 2 * (t % 32 % 4) + (e & 1)
            with np.errstate(over="ignore", invalid="ignore"):
                acc_s = np.exp2(acc_s * np.float32(scale * LOG2E) - sL[col])
            need_mask = n0 + block_n > sk
            if has_mask and right >= 0 and n0 + block_n - 1 - (m0 + diag) > right:
                need_mask = True
            if has_mask and left >= 0 and n0 - (m0 + block_m - 1 + diag) < -left:
                need_mask = True
            if need_mask:
                rel_lo = -left if has_mask and left >= 0 else -0x7FFFFFFF
                rel_hi = right if has_mask and right >= 0 else 0x7FFFFFFF
                key = n0 + key_row + 8 * (e >> 1)
                rel = key - (m0 + q_col0 + 2 * (t % 32 % 4) + diag + 8 * j + (e & 1))
                dead = (key >= sk) | (rel < rel_lo) | (rel > rel_hi)
                acc_s = np.where(dead, 0.0, acc_s)
            acc_dp = acc_s * (acc_dp - sD[col])
            row = key_row + 8 * (e >> 1)
            sm.store(p_off + swz_offset(block_n, row, col), rnd(acc_s, dt))
            sm.store(s_off + swz_offset(block_n, row, col), rnd(acc_dp, dt))
        for wg in range(2):  # after the barrier: this warpgroup's 128 columns
            block = dq_accum[hq].reshape(-1)[m0 * hd : (m0 + block_m) * hd]  # a view
            for half in range(2):
                d = np.zeros((64, 64), np.float32)
                for kk in range(block_n // 16):
                    a = fetch_mnmajor(sm, s_off + kk * 16 * 128, block_n * 128, 1024, 64)
                    b = fetch_mnmajor(
                        sm, k_off + (2 * wg + half) * kv_col + kk * 16 * 128, kv_col, 1024, 64
                    )
                    d += a @ b.T
                acc_dq = gather_acc(d)  # [128][32]
                i = np.arange(32)[None, :]
                w, lane = 4 * wg + t // 32, t % 32
                flat = ((w * 16 + 8 * half + i // 4) * 32 + lane) * 4 + i % 4
                np.add.at(block, flat, acc_dq)
            dv_d = np.zeros((64, 128), np.float32)
            dk_d = np.zeros((64, 128), np.float32)
            for kk in range(block_m // 16):
                b_do = fetch_mnmajor(
                    sm, sdO + 2 * wg * q_col + kk * 16 * 128, q_col, 1024, 128
                )  # [n][k]
                b_q = fetch_mnmajor(sm, sQ + 2 * wg * q_col + kk * 16 * 128, q_col, 1024, 128)
                dv_d += fetch_kmajor(sm, p_off + kk * 32, 1024, 64) @ b_do.T
                dk_d += fetch_kmajor(sm, s_off + kk * 32, 1024, 64) @ b_q.T
            acc_dv[wg] += gather_acc(dv_d)
            acc_dk[wg] += gather_acc(dk_d)
    # epilogue: dK * scale, dV staged through the K / V tiles, rows < keys stored
    for wg in range(2):
        i = np.arange(64)[None, :]
        j, e = i // 4, i % 4
        row = key_row + 8 * (e >> 1)
        col = 128 * wg + 8 * j + 2 * (t % 4) + (e & 1)
        sm.store(k_off + swz_offset(block_n, row, col), rnd(acc_dk[wg] * scale, dt))
        sm.store(v_off + swz_offset(block_n, row, col), rnd(acc_dv[wg], dt))
    r = np.arange(block_n)[:, None]
    c = np.arange(hd)[None, :]
    dk_out = sm.load(k_off + swz_offset(block_n, r, c))
    dv_out = sm.load(v_off + swz_offset(block_n, r, c))
    return dk_out[:keys], dv_out[:keys]


def reference(q, k, v, do, scale, window):  # noqa: ANN001, ANN201
    """float64 attention forward (out, lse) and gradients; q (sq, h, d), k / v (sk, hk, d)."""
    sq, h, d = q.shape
    sk, hk, _ = k.shape
    grp = h // hk
    kk = np.repeat(k, grp, axis=1).astype(np.float64)
    vv = np.repeat(v, grp, axis=1).astype(np.float64)
    qq, dd = q.astype(np.float64), do.astype(np.float64)
    s = np.einsum("qhd,khd->hqk", qq, kk) * scale
    i = np.arange(sq)[:, None] + sk - sq
    jk = np.arange(sk)[None, :]
    left, right = window
    vis = np.ones((sq, sk), bool)
    if left >= 0:
        vis &= jk >= i - left
    if right >= 0:
        vis &= jk <= i + right
    s = np.where(vis[None], s, -np.inf)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    p = np.exp(s - mx)
    den = p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(den > 0, np.log(den) + mx, -np.inf)[..., 0]
        p = np.where(den > 0, p / den, 0.0)
    out = np.einsum("hqk,khd->qhd", p, vv)
    dp = np.einsum("qhd,khd->hqk", dd, vv)
    dsum = np.einsum("qhd,qhd->hq", dd, out)
    ds = p * (dp - dsum[..., None])
    dq = np.einsum("hqk,khd->qhd", ds, kk) * scale
    dk = np.einsum("hqk,qhd->khd", ds, qq) * scale
    dv = np.einsum("hqk,qhd->khd", p, dd)
    dk = dk.reshape(sk, hk, grp, d).sum(2)
    dv = dv.reshape(sk, hk, grp, d).sum(2)
    return out, lse, dq, dk, dv


def backward_model(sq, sk, h, hk, hd, window, seed=0, dt=np.float16):  # noqa: ANN001, ANN201
    """dq, dk, dv from the kernel model (with the preprocess / convert passes) and the float64
    reference, for batch 1."""
    rng = np.random.default_rng(seed)
    q, k, v, do = (
        rnd(rng.standard_normal(s), dt)
        for s in ((sq, h, hd), (sk, hk, hd), (sk, hk, hd), (sq, h, hd))
    )
    scale = hd**-0.5
    out, lse, *ref = reference(q, k, v, do, scale, window)
    out = rnd(out, dt)
    block_m = 128 if hd == 64 else 64
    block_n = 64 if hd == 256 else 128
    pad = -(-sq // block_m) * block_m
    lse2 = np.full((h, pad), np.inf, np.float32)
    dpsum = np.zeros((h, pad), np.float32)
    lse2[:, :sq] = np.where(np.isfinite(lse), lse.astype(np.float32) * np.float32(LOG2E), np.inf)
    dpsum[:, :sq] = np.einsum("qhd,qhd->hq", do.astype(np.float32), out.astype(np.float32))
    dq_accum = np.zeros((h, pad, hd), np.float32)
    dk = np.zeros((sk, hk, hd), np.float32)
    dv = np.zeros((sk, hk, hd), np.float32)
    smem = 2 * block_n * hd * 2 + 4 * block_m * hd * 2 + 2 * block_n * block_m * 2
    cta = run_cta_wide if hd == 256 else run_cta
    for n_block in range(-(-sk // block_n)):
        for hkk in range(hk):
            a, b = cta(
                smem,
                hd,
                q,
                k,
                v,
                do,
                lse2,
                dpsum,
                dq_accum,
                n_block,
                hkk,
                h // hk,
                scale,
                window,
                dt,
            )
            dk[n_block * block_n : n_block * block_n + a.shape[0], hkk] = a
            dv[n_block * block_n : n_block * block_n + b.shape[0], hkk] = b
    # the convert pass (flash_bwd_dq_convert built with FS_DQ_FRAG = block_m): element (row,
    # col) read through frag_index
    r = np.arange(sq)[:, None]
    c = np.arange(hd)[None, :]
    rb = r % block_m
    at = (r - rb) * hd + frag_index(block_m, rb, c - c % 2, hd) + c % 2
    dq = rnd(dq_accum.reshape(h, -1)[:, at].transpose(1, 0, 2) * scale, dt)
    return (dq, dk, dv), ref


def frag_index(block_m: int, r: np.ndarray, col: np.ndarray, hd: int) -> np.ndarray:
    """cuda/flash_bwd.cu's frag_index: the offset in floats, within its block of block_m rows,
    of the even column `col` of block row `r` in the wgmma backward's fragment order."""
    wg_cols = hd // 2 if block_m == 64 else hd  # a warpgroup's dQ columns
    wg = col // wg_cols if block_m == 64 else r >> 6
    c = col % wg_cols if block_m == 64 else col
    w = wg * 4 + ((r & 63) >> 4)
    lane = 4 * (r & 7) + ((c & 7) >> 1)
    return ((w * (wg_cols // 8) + (c >> 3)) * 32 + lane) * 4 + 2 * ((r >> 3) & 1)


def check_forward_descriptors() -> None:
    """The model's descriptor reading on the GPU-verified forward's operands: Q K^T (both
    K-major, 128-row tiles, k-steps by +32 bytes inside a column block) and P V (V MN-major,
    LBO = the 16 KB column block, SBO = 1024, k-steps of 16 rows = 2048 bytes)."""
    hd = 128
    rng = np.random.default_rng(1)
    kt = rng.standard_normal((128, hd)).astype(np.float32)
    sm = Smem(128 * hd * 2)
    r, c = np.arange(128)[:, None], np.arange(hd)[None, :]
    sm.store(swz_offset(128, r, c), kt)
    for kk in range(hd // 16):
        koff = (kk >> 2) * 128 * 128 + (kk & 3) * 32
        assert np.array_equal(fetch_kmajor(sm, koff, 1024, 128), kt[:, 16 * kk : 16 * kk + 16])
    for kk in range(128 // 16):  # the same tile as V: B[k = key][n = head dim]
        got = fetch_mnmajor(sm, kk * 16 * 128, 128 * 128, 1024, hd)  # [n][k]
        assert np.array_equal(got.T, kt[16 * kk : 16 * kk + 16, :])


CASES = [
    # sq, sk, h, hk, hd, window
    (150, 200, 2, 1, 64, (-1, -1)),
    (200, 150, 2, 2, 64, (-1, 0)),
    (130, 260, 4, 2, 128, (-1, 0)),
    (100, 300, 2, 1, 128, (40, 20)),
    (1, 129, 2, 2, 128, (-1, -1)),
    (300, 650, 4, 2, 64, (64, 0)),
    (65, 63, 4, 1, 64, (48, 0)),
    (100, 150, 2, 1, 256, (-1, -1)),
    (150, 90, 2, 2, 256, (-1, 0)),
    (70, 200, 4, 2, 256, (30, 10)),
]


def main() -> int:
    check_forward_descriptors()
    print("forward descriptors: the model reads Q K^T and P V as the verified kernel does")
    worst = 0.0
    for case in CASES:
        got, ref = backward_model(*case)
        errs = []
        for name, g, r in zip(("dq", "dk", "dv"), got, ref):
            assert np.isfinite(g).all(), f"{case} {name}: not finite (an unwritten element?)"
            rel = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-6))
            errs.append(f"{name} {rel:.1e}")
            worst = max(worst, rel)
        print(f"{case}: " + ", ".join(errs))
    print(f"worst max-abs error relative to max|ref|: {worst:.1e}")
    return 0 if worst < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
