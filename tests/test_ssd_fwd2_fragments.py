"""The ldmatrix lane addresses and fragment uses of cuda/ssd_fwd2.cu, emulated on the CPU: each
warp product of the three kernels, built the way the kernel builds it (the lane_* address
formulas, ldmatrix with and without .trans, m16n8k16 register layouts, the W fragments taken
from accumulators), must equal the plain matrix product of the shared-memory tiles. No GPU runs
this path yet, so this is what pins the operand plumbing down until one does.

PTX semantics used (PTX ISA, ldmatrix / mma.m16n8k16): ldmatrix .x4 takes lane l's address as
row l % 8 of matrix l / 8 and gives lane 4 r + c register m = matrix m's (row r, columns 2c, 2c+1)
(.trans: (rows 2c, 2c+1, column r)); mma A registers (row g, k 2t..) (g + 8, 2t..) (g, 2t + 8..)
(g + 8, 2t + 8..), B (k 2t.., n g) (k 2t + 8.., n g), C (g, 2t..) (g + 8, 2t..), lane = 4 g + t.
"""

from __future__ import annotations

import numpy as np
import pytest


# the kernel's lane address helpers (elements from the tile origin), verbatim
def lane_a(lane: int, ld: int) -> int:
    return (lane & 15) * ld + (lane >> 4) * 8


def lane_bn(lane: int, ld: int) -> int:
    return ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8


def lane_at(lane: int, ld: int) -> int:
    return ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8


def lane_bt(lane: int, ld: int) -> int:
    return ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8


def ldsm_x4(smem: np.ndarray, addrs: list[int], trans: bool) -> np.ndarray:
    """(32 lanes, 4 registers, 2 halves) from a flat element array; addrs[l] = lane l's row."""
    out = np.zeros((32, 4, 2))
    for m in range(4):
        mat = np.stack([smem[addrs[8 * m + r] : addrs[8 * m + r] + 8] for r in range(8)])
        if trans:
            mat = mat.T
        for lane in range(32):
            r, c = lane >> 2, lane & 3
            out[lane, m] = mat[r, 2 * c : 2 * c + 2]
    return out


def mma(acc: np.ndarray, a: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> None:
    """acc (32, 4) += A (from a (32, 4, 2)) B (from b0, b1 (32, 2)), m16n8k16."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g, 2 * t : 2 * t + 2] = a[lane, 0]
        A[g + 8, 2 * t : 2 * t + 2] = a[lane, 1]
        A[g, 2 * t + 8 : 2 * t + 10] = a[lane, 2]
        A[g + 8, 2 * t + 8 : 2 * t + 10] = a[lane, 3]
        B[2 * t : 2 * t + 2, g] = b0[lane]
        B[2 * t + 8 : 2 * t + 10, g] = b1[lane]
    D = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        acc[lane] += [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]


def acc_tile(acc: np.ndarray) -> np.ndarray:
    """(NT, 32, 4) accumulators -> the warp's 16 x 8 NT tile."""
    nt = acc.shape[0]
    out = np.zeros((16, 8 * nt))
    for j in range(nt):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            out[g, 8 * j + 2 * t : 8 * j + 2 * t + 2] = acc[j, lane, :2]
            out[g + 8, 8 * j + 2 * t : 8 * j + 2 * t + 2] = acc[j, lane, 2:]
    return out


def mma_row(acc, a, smem, b_base_of_lane, b_step, trans):
    """mma_row<NT, trans>: NT / 2 ldmatrix of B at base + np * step, two n8 tiles each."""
    for np_ in range(acc.shape[0] // 2):
        bf = ldsm_x4(smem, [b_base_of_lane(lane) + np_ * b_step for lane in range(32)], trans)
        mma(acc[2 * np_], a, bf[:, 0], bf[:, 1])
        mma(acc[2 * np_ + 1], a, bf[:, 2], bf[:, 3])


@pytest.mark.parametrize("warp", [0, 3])
def test_chunk_cb_product(warp: int) -> None:
    """ssd2_chunk_cb: C [l][n] (A, non-trans) times B [s][n] (B stored [n][k], non-trans),
    32-wide k step = 2 k16 blocks, pitch kLd32."""
    rng = np.random.default_rng(1)
    ld, w16 = 40, 16 * warp
    C = rng.standard_normal((64, 32))
    Bt = rng.standard_normal((64, 32))
    sc = np.zeros(64 * ld)
    sb = np.zeros(64 * ld)
    for r in range(64):
        sc[r * ld : r * ld + 32] = C[r]
        sb[r * ld : r * ld + 32] = Bt[r]
    acc = np.zeros((8, 32, 4))
    for kk in range(2):
        a = ldsm_x4(sc, [w16 * ld + lane_a(lane, ld) + 16 * kk for lane in range(32)], False)
        mma_row(acc, a, sb, lambda lane, kk=kk: lane_bn(lane, ld) + 16 * kk, 16 * ld, False)
    np.testing.assert_allclose(acc_tile(acc), C[w16 : w16 + 16] @ Bt.T, atol=1e-12)


@pytest.mark.parametrize("warp", [0, 2])
def test_chunk_state_product_with_weights(warp: int) -> None:
    """ssd2_chunk_state: x^T from x [s][p] (A, .trans at column w16), scaled per k (position)
    in the fragment, times B [s][n] (.trans), pitches kLd64 / kLd128, 16 n8 tiles."""
    rng = np.random.default_rng(2)
    ldx, ldb, w16 = 72, 136, 16 * warp
    X = rng.standard_normal((32, 64))
    Bm = rng.standard_normal((32, 128))
    w = rng.standard_normal(32)
    sx = np.zeros(32 * ldx)
    sb = np.zeros(32 * ldb)
    for r in range(32):
        sx[r * ldx : r * ldx + 64] = X[r]
        sb[r * ldb : r * ldb + 128] = Bm[r]
    acc = np.zeros((16, 32, 4))
    for kk in range(2):
        a = ldsm_x4(sx, [w16 + lane_at(lane, ldx) + kk * 16 * ldx for lane in range(32)], True)
        for lane in range(32):  # a[0], a[1]: k = 2t, 2t+1; a[2], a[3]: k + 8
            t2 = 2 * (lane & 3)
            wl = w[16 * kk + t2 : 16 * kk + t2 + 2]
            wh = w[16 * kk + t2 + 8 : 16 * kk + t2 + 10]
            for e in range(4):
                a[lane, e] *= wl if e < 2 else wh
        mma_row(acc, a, sb, lambda lane, kk=kk: lane_bt(lane, ldb) + kk * 16 * ldb, 16, True)
    want = (X[:, w16 : w16 + 16] * w[:, None]).T @ Bm
    np.testing.assert_allclose(acc_tile(acc), want, atol=1e-12)


# ---- the wgmma form of the chunk-state product (common/ssd_tiles.cuh, sm_90a) ----------------
K_WG_POS = 64  # positions a step of the wgmma product (kWgPos)
K_BZ_BLOCK = K_WG_POS * 128  # bytes of one 64-column block of a B stage (kBzBlock)


def swizzle128(addr: int) -> int:
    """The 128-byte swizzle wgmma applies to a shared-memory address: bits [4:6] ^= bits [7:9]."""
    return addr ^ (((addr >> 7) & 7) << 4)


def load_tile_sw(tile: np.ndarray, valid_rows: int, valid_cols: int) -> dict[int, float]:
    """load_tile_sw<kR, kC>'s vec path (128 threads), verbatim: thread t copies 16-byte chunk
    ch = t % (kC / 8) of rows r0 + kRowStep k, r0 = t / (kC / 8), to (ch >> 3) * kR * 128 +
    r0 * 128 + (((ch & 7) ^ (r0 & 7)) << 4) + k * kRowStep * 128 (zero-filled where the row or the
    column is past the valid ones). Returns byte address -> element."""
    rows, cols = tile.shape
    per_row = cols // 8
    row_step, passes = 128 // per_row, rows * per_row // 128
    smem: dict[int, float] = {}
    for t in range(128):
        r0, ch = t // per_row, t % per_row
        dst = (ch >> 3) * rows * 128 + r0 * 128 + (((ch & 7) ^ (r0 & 7)) << 4)
        for k in range(passes):
            row = r0 + row_step * k
            ok = ch * 8 < valid_cols and row < valid_rows
            for e in range(8):
                addr = dst + k * row_step * 128 + 2 * e
                assert addr not in smem, "a byte written twice"
                smem[addr] = tile[row, ch * 8 + e] if ok else 0.0
    assert len(smem) == rows * cols, "every element of the tile written"
    return smem


def load_tile_bz(tile: np.ndarray, valid_rows: int, valid_cols: int) -> dict[int, float]:
    """load_tile_bz = load_tile_sw<kWgPos, 128>."""
    assert tile.shape == (K_WG_POS, 128)
    return load_tile_sw(tile, valid_rows, valid_cols)


def swz_offset(rows: int, row: int, col: int) -> int:
    """common/wgmma.cuh swz_offset, verbatim."""
    block, chunk = col >> 6, (col >> 3) & 7
    return block * rows * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + (col & 7) * 2


def wgmma_k_major(smem: dict[int, float], start: int, rows: int, sbo: int) -> np.ndarray:
    """A (rows x k16) or B (N rows x k16) of wgmma from a K-major, 128B-swizzled descriptor whose
    start address selects the k16 slice (PTX ISA: rows of 128 bytes, 8-row groups SBO apart)."""
    out = np.zeros((rows, 16))
    for r in range(rows):
        for k in range(16):
            addr = start + (r // 8) * sbo + (r % 8) * 128 + 2 * k
            out[r, k] = smem[swizzle128(addr)]
    return out


def wgmma_b_mn_major(
    smem: dict[int, float], start: int, lbo: int, sbo: int, n_cols: int = 128
) -> np.ndarray:
    """The k16 x N B operand of wgmma from an MN-major, 128B-swizzled descriptor (PTX ISA:
    64-element column blocks LBO bytes apart along N, 8-row groups SBO bytes apart along K)."""
    out = np.zeros((16, n_cols))
    for k in range(16):
        for n in range(n_cols):
            addr = start + (n // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (n % 64) * 2
            out[k, n] = smem[swizzle128(addr)]
    return out


def wgmma_desc(saddr: int, lbo: int, sbo: int) -> int:
    """common/wgmma.cuh wgmma_desc, verbatim (64-bit)."""
    d = (saddr & 0x3FFFF) >> 4
    d |= ((lbo >> 4) & 0x3FFF) << 16
    d |= ((sbo >> 4) & 0x3FFF) << 32
    return d | (1 << 62)


def desc_at(d: int, nbytes: int) -> int:
    """common/wgmma.cuh desc_at, verbatim: a 32-bit add to the descriptor's low word."""
    return (d & 0xFFFFFFFF00000000) | ((d + (nbytes >> 4)) & 0xFFFFFFFF)


@pytest.mark.parametrize(("lbo", "sbo"), [(16, 1024), (64 * 128, 1024), (K_BZ_BLOCK, 1024)])
def test_desc_at_steps_equal_formed_descriptors(lbo: int, sbo: int) -> None:
    """The scan's and the state product's k steps: desc_at(wgmma_desc(base), off) must be the
    descriptor wgmma_desc(base + off) forms, for every 1024-aligned tile base in a 227 KB shared
    window and every step offset the kernels take (k16 steps of 32 or 2048 bytes, up to a tile's
    end)."""
    for base in range(0, 227 * 1024, 1024):
        d = wgmma_desc(base, lbo, sbo)
        for off in [32 * k for k in range(4)] + [2048 * k for k in range(8)]:
            if base + off < 227 * 1024:
                assert desc_at(d, off) == wgmma_desc(base + off, lbo, sbo), (base, off)


@pytest.mark.parametrize(("valid_rows", "valid_cols"), [(64, 128), (45, 128), (19, 128), (64, 72)])
def test_chunk_state_product_on_wgmma(valid_rows: int, valid_cols: int) -> None:
    """weighted_state_product_wg: B staged by load_tile_bz, read by m64n128k16 through
    wgmma_desc(b_base + kk * 16 * 128, kBzBlock, 1024); A per warp is the mma.sync A fragment of
    x^T scaled per position (as above). The warpgroup's product must equal (x^T w) B over the
    valid rows / columns, zero elsewhere."""
    rng = np.random.default_rng(5)
    ldx = 72
    X = rng.standard_normal((K_WG_POS, 64))
    Bm = rng.standard_normal((K_WG_POS, 128))
    w = rng.standard_normal(K_WG_POS)
    smem = load_tile_bz(Bm, valid_rows, valid_cols)
    rows_ok = np.arange(K_WG_POS)[:, None] < valid_rows
    Bv = np.where(rows_ok & (np.arange(128)[None, :] < valid_cols), Bm, 0.0)
    sx = np.zeros(K_WG_POS * ldx)
    for r in range(K_WG_POS):
        sx[r * ldx : r * ldx + 64] = X[r]
    got = np.zeros((64, 128))
    for kk in range(K_WG_POS // 16):
        B = wgmma_b_mn_major(smem, kk * 16 * 128, K_BZ_BLOCK, 1024)
        for warp in range(4):
            w16 = 16 * warp
            a = ldsm_x4(sx, [w16 + lane_at(lane, ldx) + kk * 16 * ldx for lane in range(32)], True)
            A = np.zeros((16, 16))
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                wl = w[16 * kk + 2 * t : 16 * kk + 2 * t + 2]
                wh = w[16 * kk + 2 * t + 8 : 16 * kk + 2 * t + 10]
                A[g, 2 * t : 2 * t + 2] = a[lane, 0] * wl
                A[g + 8, 2 * t : 2 * t + 2] = a[lane, 1] * wl
                A[g, 2 * t + 8 : 2 * t + 10] = a[lane, 2] * wh
                A[g + 8, 2 * t + 8 : 2 * t + 10] = a[lane, 3] * wh
            got[w16 : w16 + 16] += A @ B
    np.testing.assert_allclose(got, (X * w[:, None]).T @ Bv, atol=1e-12)


@pytest.mark.parametrize(("valid_rows", "valid_cols"), [(64, 64), (37, 64), (64, 40)])
def test_chunk_scan_operands_on_wgmma(valid_rows: int, valid_cols: int) -> None:
    """ssd2_chunk_scan on wgmma: C (l x n) and H (p x n) tiles by load_tile_sw<64, 64>, read as
    K-major A / B through wgmma_desc(base + kk * 32, 16, 1024); the x tile (s x p) as the MN-major
    B of W x through wgmma_desc(base + kk * 16 * 128, 64 * 128, 1024); the epilogue's x reads at
    swz_offset(64, r, c). Each must give back the tile (zero past the valid rows / columns)."""
    rng = np.random.default_rng(6)
    T = rng.standard_normal((64, 64))
    valid = (np.arange(64)[:, None] < valid_rows) & (np.arange(64)[None, :] < valid_cols)
    Tv = np.where(valid, T, 0.0)
    smem = load_tile_sw(T, valid_rows, valid_cols)
    for kk in range(4):
        km = wgmma_k_major(smem, kk * 32, 64, 1024)
        np.testing.assert_array_equal(km, Tv[:, 16 * kk : 16 * kk + 16])
        mn = wgmma_b_mn_major(smem, kk * 16 * 128, 64 * 128, 1024, 64)
        np.testing.assert_array_equal(mn, Tv[16 * kk : 16 * kk + 16, :])
    for r in range(64):
        for c in range(0, 64, 2):
            assert smem[swz_offset(64, r, c)] == Tv[r, c]
            assert smem[swz_offset(64, r, c) + 2] == Tv[r, c + 1]


@pytest.mark.parametrize("warp", [1, 3])
def test_chunk_scan_products(warp: int) -> None:
    """ssd2_chunk_scan: C [l][n] . H [p][n] (non-trans, kLd64, 4 k16 blocks), then W (taken
    from accumulators as A fragments, acc_to_a) times x [s][p] (.trans)."""
    rng = np.random.default_rng(3)
    ld, w16 = 72, 16 * warp
    C = rng.standard_normal((64, 64))
    H = rng.standard_normal((64, 64))
    X = rng.standard_normal((64, 64))
    W = rng.standard_normal((16, 64))  # this warp's rows of W
    sc, sh, sx = np.zeros(64 * ld), np.zeros(64 * ld), np.zeros(64 * ld)
    for r in range(64):
        sc[r * ld : r * ld + 64] = C[r]
        sh[r * ld : r * ld + 64] = H[r]
        sx[r * ld : r * ld + 64] = X[r]
    acc = np.zeros((8, 32, 4))
    for kk in range(4):
        a = ldsm_x4(sc, [w16 * ld + lane_a(lane, ld) + 16 * kk for lane in range(32)], False)
        mma_row(acc, a, sh, lambda lane, kk=kk: lane_bn(lane, ld) + 16 * kk, 16 * ld, False)
    np.testing.assert_allclose(acc_tile(acc), C[w16 : w16 + 16] @ H.T, atol=1e-12)

    # W in the accumulator layout: wv[jn][e] = W[g + 8 (e >> 1), 8 jn + 2t + (e & 1)]
    wv = np.zeros((8, 32, 4))
    for jn in range(8):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for e in range(4):
                wv[jn, lane, e] = W[g + 8 * (e >> 1), 8 * jn + 2 * t + (e & 1)]
    acc2 = np.zeros((8, 32, 4))
    for kk in range(4):
        a = np.zeros((32, 4, 2))  # acc_to_a(a, wv[2 kk], wv[2 kk + 1])
        a[:, 0] = wv[2 * kk][:, 0:2]
        a[:, 1] = wv[2 * kk][:, 2:4]
        a[:, 2] = wv[2 * kk + 1][:, 0:2]
        a[:, 3] = wv[2 * kk + 1][:, 2:4]
        mma_row(acc2, a, sx, lambda lane, kk=kk: lane_bt(lane, ld) + kk * 16 * ld, 16, True)
    np.testing.assert_allclose(acc_tile(acc2), W @ X, atol=1e-12)
