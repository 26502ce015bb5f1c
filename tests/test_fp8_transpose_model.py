"""The FP8 forward's in-kernel V transpose (cuda/flash_fwd_sm90_tma.cu, `transpose_v_tiles`)
replayed in NumPy on the CPU: the producer warps' ldmatrix .trans addresses, byte permutes and
stmatrix addresses turn a raw V tile (TMA's 128-byte swizzle, key rows) into the Vt stage the 8-bit
P V wgmma reads (head-dim rows, keys permuted in each 16 as P's registers hold them: the layout
the pre-pass cuda/flash_fp8_vt.cu writes), every unit is done once, the loads meet no bank
conflict and the stores at most a 2-way one."""

from __future__ import annotations

import numpy as np
import pytest

ROW = 128  # bytes of a raw key row and of a Vt row
KEYS = 128
TRANSPOSE_WARPS = 3
UNITS = 32  # 16 keys x 32 head-dim bytes each


def key_at(col: int) -> int:
    """The key whose value sits at column `col` of a Vt row (cuda/flash_fp8_vt.cu, key_at)."""
    r = col & 15
    return (col & ~15) + 2 * (r >> 2) + (r & 1) + 8 * ((r >> 1) & 1)


def swizzled(row: int, byte: int) -> int:
    """The 128-byte swizzle: chunk c of row r at r * 128 + (c ^ r % 8) * 16."""
    return row * ROW + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15)


def raw_tile(v: np.ndarray) -> np.ndarray:
    mem = np.zeros(KEYS * ROW, np.uint8)
    for r in range(KEYS):
        for b in range(ROW):
            mem[swizzled(r, b)] = v[r, b]
    return mem


def ldsm_x4_trans(mem: np.ndarray, addrs: list[int]) -> list[list[int]]:
    """ldmatrix.sync.aligned.m8n8.x4.trans.b16: lane l gives the row address of row l % 8 of
    matrix l / 8; lane l receives, of each matrix i, (M_i[2 (l % 4)][l / 4], M_i[2 (l % 4) +
    1][l / 4]) as the low and high halves of register i (each element two bytes, little endian)."""
    out = []
    for lane in range(32):
        regs = []
        for i in range(4):
            q, jj = lane & 3, lane >> 2
            lo = addrs[8 * i + 2 * q] + 2 * jj
            hi = addrs[8 * i + 2 * q + 1] + 2 * jj
            b = [int(mem[lo]), int(mem[lo + 1]), int(mem[hi]), int(mem[hi + 1])]
            regs.append(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)
        out.append(regs)
    return out


def prmt(a: int, b: int, sel: int) -> int:
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def stsm_x4(mem: np.ndarray, addrs: list[int], regs: list[list[int]]) -> None:
    """stmatrix.sync.aligned.m8n8.x4.b16: lane l gives the row address of row l % 8 of matrix
    l / 8; register i of lane l is matrix i's row l / 4, bytes 4 (l % 4) .. + 3."""
    for lane in range(32):
        for i in range(4):
            a = addrs[8 * i + (lane >> 2)] + 4 * (lane & 3)
            for b in range(4):
                mem[a + b] = (regs[lane][i] >> (8 * b)) & 0xFF


def conflict_ways(addrs: list[int], width: int) -> int:
    """Bank cycles of one phase of a shared access: the most distinct 4-byte words any bank
    holds (ldmatrix / stmatrix: a phase is one matrix, 8 rows of 16 bytes)."""
    words: dict[int, set[int]] = {}
    for a in addrs:
        for w in range(a // 4, (a + width) // 4):
            words.setdefault(w % 32, set()).add(w)
    return max(len(ws) for ws in words.values())


def transpose(
    raw: np.ndarray,
    check_banks: bool = True,
    sels: tuple[int, int] = (0x6420, 0x7531),
    swap: bool = False,
) -> tuple[np.ndarray, list[int]]:
    """The kernel's loop over one tile, every transposing warp; returns the Vt stage's bytes and
    how many times each unit was done."""
    vt = np.zeros(KEYS * ROW, np.int32) - 1
    done = [0] * UNITS
    for tw in range(TRANSPOSE_WARPS):
        for u in range(tw, UNITS, TRANSPOSE_WARPS):
            done[u] += 1
            h, cp = u >> 2, u & 3
            ld, st = [], []
            for lane in range(32):
                mi, mj = lane >> 3, lane & 7
                ld_row = (8 * (mi & 1) + mj) * 128
                ld.append(h * 2048 + ld_row + (((2 * cp + (mi >> 1)) ^ mj) << 4))
                # (FS_FP8_TRANSPOSE_SEL: rows r >= 4 of each matrix pair swapped)
                st_r = 2 * mj + (1 - (mi & 1) if swap and mj >= 4 else mi & 1)
                st_row = ((mi >> 1) * 16 + st_r) * 128
                st.append(cp * 32 * 128 + st_row + ((h ^ (st_r & 7)) << 4))
            if check_banks:
                for phase in range(4):
                    assert conflict_ways(ld[8 * phase : 8 * phase + 8], 16) == 1
                    # (rows 2 r share four swizzle phases: 2-way, see the kernel's comment;
                    # the swapped rows fall in eight)
                    assert conflict_ways(st[8 * phase : 8 * phase + 8], 16) == (1 if swap else 2)
            m = ldsm_x4_trans(raw, ld)
            regs = []
            for lane in range(32):
                a = [prmt(m[lane][2 * x], m[lane][2 * x + 1], sel) for x in (0, 1) for sel in sels]
                if swap and lane >= 16:
                    a = [a[1], a[0], a[3], a[2]]
                regs.append(a)
            stsm_x4(vt, st, regs)
    return vt, done


def want_vt(v: np.ndarray) -> np.ndarray:
    want = np.zeros(KEYS * ROW, np.int32)
    for d in range(ROW):
        for col in range(KEYS):
            want[swizzled(d, col)] = v[key_at(col), d]
    return want


@pytest.mark.parametrize("swap", [False, True])
def test_the_transpose_writes_the_prepass_layout_once_and_without_bank_conflicts(
    swap: bool,
) -> None:
    rng = np.random.default_rng(0)
    v = rng.integers(0, 256, size=(KEYS, ROW), dtype=np.uint8)
    vt, done = transpose(raw_tile(v), swap=swap)
    assert done == [1] * UNITS
    assert (vt >= 0).all(), "every Vt byte written"
    np.testing.assert_array_equal(vt, want_vt(v))


def test_the_permuted_columns_are_the_order_of_p_registers() -> None:
    """pack_p's register e of thread t holds keys {2t, 2t+1, 8+2t, 9+2t} of each 16: the word
    at column 16 h + 4 t of a Vt row must hold those keys in that order."""
    for h in range(8):
        for t in range(4):
            keys = [key_at(16 * h + 4 * t + e) for e in range(4)]
            k0 = 16 * h + 2 * t
            assert keys == [k0, k0 + 1, k0 + 8, k0 + 9]


def test_the_model_fails_on_a_wrong_permute() -> None:
    """The replay can fail: the byte selectors swapped (rows d and d + 1 exchanged) or the key
    pairs' selector of another layout break the comparison."""
    rng = np.random.default_rng(1)
    v = rng.integers(0, 256, size=(KEYS, ROW), dtype=np.uint8)
    raw = raw_tile(v)
    assert prmt(0x33221100, 0x77665544, 0x6420) == 0x66442200
    assert prmt(0x33221100, 0x77665544, 0x7531) == 0x77553311
    for sels in ((0x7531, 0x6420), (0x6240, 0x7351)):
        vt, _ = transpose(raw, check_banks=False, sels=sels)
        assert not np.array_equal(vt, want_vt(v)), hex(sels[0])
