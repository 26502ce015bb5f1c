"""A NumPy model of ssd_bwd_dstate_pass (cuda/ssd_bwd.cu section 8j: the SSD backward's L_c and
reverse state passing in one sm_90a kernel), checked on the CPU where the kernel cannot run.

Two parts. The ring: the kernel's step order (the last chunk, maybe short, first; then whole
chunks down to chunk 0), its two TMA stages, the two record buffers and the one H_c buffer, replayed
step by step: no buffer is refilled before its last reader finished, every step reads its own data.
The arithmetic: the kernel's tiles (64 x 128 of (headdim, dstate), four warps of 16 rows), its
32-position steps in that order, zero-filled boxes past the tensors' ends, dS_c stored at each
chunk's first step, each warp's df_c partial, dinitial_states after chunk 0; against the plain
float64 recurrence the pair (ssd_bwd_chunk_dstate16 + ssd_bwd_state_passing) computes:
    G = dfinal;  for c = nc - 1 .. 0:  dS_c = G;  df_c = <G, H_c>;  G = f_c G + L_c;  dinit = G
with L_c = sum_l e_l g_l^T C_l, e_l = exp(cum_l). Outputs start NaN, so an element the model's
kernel never writes fails the comparison.
"""

from __future__ import annotations

import numpy as np
import pytest

POS = 32  # kSpPos: positions a step
TILE_P, TILE_N = 64, 128  # a CTA's tile of (headdim, dstate)
WARPS = 4  # warp w owns rows 16 w .. 16 w + 15


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _steps(seqlen: int, kq: int) -> list[tuple[int, int]]:
    """The kernel's step_of over t = 0 .. nsteps - 1: (processing index j, step k of chunk
    nc - 1 - j); the last chunk's steps only up to seqlen."""
    nc = _ceil(seqlen, kq)
    first = _ceil(seqlen - (nc - 1) * kq, POS)
    out = [(0, k) for k in range(first)]
    out += [(j, k) for j in range(1, nc) for k in range(kq // POS)]
    return out


def _replay_ring(seqlen: int, kq: int, stages: int = 2, h_with_steps: bool = False) -> int:
    """Thread 0 issues steps 0 .. stages - 2 (and chunk nc - 1's H_c) before the loop, step
    t + stages - 1 at step t's top (past the barrier that ends step t - 1) into stage t % stages,
    with a chunk's first step its record into buffer j % 2; at a chunk's first step every thread
    reads H_c (the df partial), then past a barrier thread 0 issues the next chunk's H_c.
    h_with_steps: H_c issued with its chunk's first step instead (what the kernel must not do).
    Returns the step count."""
    steps = _steps(seqlen, kq)
    nsteps, nc = len(steps), _ceil(seqlen, kq)
    last_step = {j: t for t, (j, _) in enumerate(steps)}  # (the dict keeps the last t)
    stage: dict[int, int] = {}  # stage -> the step whose data it holds
    record: dict[int, int] = {}  # buffer -> the processing index whose record it holds
    h = {"holds": -1, "read": True}
    done = -1  # the last step whose reads have finished

    def issue_h(j: int) -> None:
        assert h["read"], f"chunk {j}'s H_c over chunk {h['holds']}'s, not yet read"
        h["holds"], h["read"] = j, False

    def issue(u: int) -> None:
        if u >= nsteps:
            return
        s = u % stages
        if s in stage:
            assert stage[s] <= done, f"step {u} refills stage {s} while step {stage[s]} reads it"
        stage[s] = u
        j, k = steps[u]
        if k == 0:
            last = record.get(j % 2)
            if last is not None:
                assert last_step[last] <= done, f"chunk {j}'s record over chunk {last}'s weights"
            record[j % 2] = j
            if h_with_steps:
                issue_h(j)

    if not h_with_steps:
        issue_h(0)
    for u in range(stages - 1):
        issue(u)
    for t in range(nsteps):
        issue(t + stages - 1)
        j, k = steps[t]
        assert stage.get(t % stages) == t, f"step {t} reads step {stage.get(t % stages)}'s stage"
        if k == 0:
            assert h["holds"] == j, f"chunk {j}'s df partial reads chunk {h['holds']}'s H_c"
            h["read"] = True
            if not h_with_steps and j + 1 < nc:
                issue_h(j + 1)  # (past the barrier that ends every thread's reads)
        assert record.get(j % 2) == j, f"step {t} reads chunk {record.get(j % 2)}'s weights"
        done = t
    return nsteps


@pytest.mark.parametrize("kq", [64, 128, 256])
@pytest.mark.parametrize("seqlen", [1, 5, 31, 33, 64, 65, 300, 513, 2048, 2 * 256 + 5, 4100])
def test_ring_reuses_nothing_early_and_covers_every_position_once(kq: int, seqlen: int) -> None:
    assert _replay_ring(seqlen, kq) == _ceil(seqlen, POS)
    nc = _ceil(seqlen, kq)
    seen = np.zeros(nc * kq, dtype=int)
    for j, k in _steps(seqlen, kq):
        c = nc - 1 - j
        seen[c * kq + k * POS : c * kq + (k + 1) * POS] += 1
    # (the last step's rows past seqlen are TMA's zero fill)
    assert (seen[:seqlen] == 1).all() and (seen[_ceil(seqlen, POS) * POS :] == 0).all()


def test_ring_replay_fails_when_h_rides_on_the_steps() -> None:
    """H_c issued with its chunk's first step, as the records are: a last chunk of one step
    (visited first) has chunk nc - 2's H_c land before its own df partial read its H_c."""
    with pytest.raises(AssertionError, match="not yet read"):
        _replay_ring(2 * 256 + 5, 256, h_with_steps=True)


# ---- the arithmetic ----------------------------------------------------------------------------


def _inputs(rng: np.random.Generator, b: int, L: int, h: int, p: int, g: int, n: int, kq: int):
    nc = _ceil(L, kq)
    dout = rng.standard_normal((b, L, h, p))
    C = rng.standard_normal((b, L, g, n))
    # cum: the in-chunk cumulative sum of dt' A (<= 0), per (batch, head, chunk, position)
    cum = np.cumsum(-rng.random((b, h, nc, kq)) * 0.1, axis=-1)
    H = rng.standard_normal((b, nc, h, p, n))
    f = np.exp(cum[..., -1])  # (the kernel reads f_c from the forward; any positive values do)
    dfinal = rng.standard_normal((b, h, p, n))
    return dout, C, cum, H, f, dfinal


def _pair(dout, C, cum, H, f, dfinal, kq: int):
    """The plain recurrence (float64): dS (b, nc, h, p, n), df (b, h, nc), dinit (b, h, p, n)."""
    b, L, h, p = dout.shape
    g, n = C.shape[2], C.shape[3]
    nc = _ceil(L, kq)
    dS = np.zeros((b, nc, h, p, n))
    df = np.zeros((b, h, nc))
    dinit = np.zeros((b, h, p, n))
    for bi in range(b):
        for hi in range(h):
            gi = hi // (h // g)
            G = dfinal[bi, hi].copy()
            for c in range(nc - 1, -1, -1):
                dS[bi, c, hi] = G
                df[bi, hi, c] = (G * H[bi, c, hi]).sum()
                s0, s1 = c * kq, min(L, (c + 1) * kq)
                e = np.exp(cum[bi, hi, c, : s1 - s0])
                Lc = (dout[bi, s0:s1, hi] * e[:, None]).T @ C[bi, s0:s1, gi]
                G = f[bi, hi, c] * G + Lc
            dinit[bi, hi] = G
    return dS, df, dinit


def _kernel(dout, C, cum, H, f, dfinal, kq: int):
    """The kernel, CTA by CTA (grid (b h, tiles)): its accumulator tile, its steps in order, its
    boxes zero-filled past the tensors' ends, its stores and its per-warp partials (dfpart
    (b h, tiles * 4, nc), summed over the partials afterwards as ssd_bwd_dt does)."""
    b, L, h, p = dout.shape
    g, n = C.shape[2], C.shape[3]
    nc = _ceil(L, kq)
    tp, tn = _ceil(p, TILE_P), _ceil(n, TILE_N)
    dS = np.full((b, nc, h, p, n), np.nan)
    dfpart = np.full((b * h, tp * tn * WARPS, nc), np.nan)
    dinit = np.full((b, h, p, n), np.nan)
    steps = _steps(L, kq)
    for bh in range(b * h):
        bi, hi = divmod(bh, h)
        gi = hi // (h // g)
        for tile in range(tp * tn):
            p0, n0 = (tile // tn) * TILE_P, (tile % tn) * TILE_N
            hd, ds = p - p0, n - n0

            def box(src: np.ndarray, r0: int, c0: int, cols: int, valid_cols: int) -> np.ndarray:
                """A TMA box of POS rows from r0: rows past seqlen, columns past valid ones zero."""
                out = np.zeros((POS, cols))
                vr = max(0, min(POS, L - r0))
                vc = max(0, min(cols, valid_cols))
                out[:vr, :vc] = src[r0 : r0 + vr, c0 : c0 + vc]
                return out

            vr, vc = min(hd, TILE_P), min(ds, TILE_N)  # the tile's valid rows and columns
            acc = np.zeros((TILE_P, TILE_N))
            acc[:vr, :vc] = dfinal[bi, hi, p0 : p0 + vr, n0 : n0 + vc]
            w = None
            for j, k in steps:
                c = nc - 1 - j
                if k == 0:
                    dS[bi, c, hi, p0 : p0 + vr, n0 : n0 + vc] = acc[:vr, :vc]
                    ht = np.zeros((TILE_P, TILE_N))  # H_c's boxes, zero past the ends
                    ht[:vr, :vc] = H[bi, c, hi, p0 : p0 + vr, n0 : n0 + vc]
                    if ds <= 64:
                        ht[:, 64:] = np.nan  # (one box loaded: the buffer's second is stale)
                    cols = TILE_N if ds > 64 else 64  # (the partial skips what one box leaves)
                    prod = acc[:, :cols] * ht[:, :cols]
                    for wi in range(WARPS):
                        part = prod[16 * wi : 16 * wi + 16].sum()
                        dfpart[bh, tile * WARPS + wi, c] = part
                    acc *= f[bi, hi, c]
                    length = min(kq, L - c * kq)
                    w = np.where(np.arange(kq) < length, np.exp(cum[bi, hi, c]), 0.0)
                s0 = c * kq + k * POS
                a = box(dout[bi, :, hi], s0, p0, TILE_P, hd)  # (POS, 64): dout
                bz = box(C[bi, :, gi], s0, n0, TILE_N, ds)
                if ds <= 64:
                    bz[:, 64:] = np.nan  # (C's second box not loaded: stale, acc's columns 64..)
                acc += (a * w[k * POS : (k + 1) * POS, None]).T @ bz
            dinit[bi, hi, p0 : p0 + vr, n0 : n0 + vc] = acc[:vr, :vc]
    df = dfpart.sum(axis=1).reshape(b, h, nc)
    return dS, df, dinit


@pytest.mark.parametrize(
    "b, L, h, p, g, n, kq",
    [
        (1, 2 * 256 + 37, 2, 64, 1, 128, 256),  # the layer's tile, a tail
        (2, 300, 4, 40, 2, 48, 128),  # partial rows, one C / H_c box, groups
        (1, 333, 2, 136, 1, 200, 64),  # 3 x 2 tiles, the last partial both ways
        (1, 20, 2, 64, 1, 64, 64),  # one chunk of one step
        (1, 3 * 256 + 5, 1, 64, 1, 32, 256),  # the last chunk one step long
    ],
)
def test_tiles_and_steps_give_the_recurrence(
    b: int, L: int, h: int, p: int, g: int, n: int, kq: int
) -> None:
    rng = np.random.default_rng(1234 + L)
    args = _inputs(rng, b, L, h, p, g, n, kq)
    want = _pair(*args, kq)
    got = _kernel(*args, kq)
    for name, x, y in zip(("dS", "df", "dinit"), got, want):
        assert not np.isnan(x).any(), f"{name}: an element never written"
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-10, err_msg=name)
