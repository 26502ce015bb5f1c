"""A NumPy model of cuda/ssd_fwd2.cu (the second SSD forward path, the 16-bit default) against
the float64 reference: the decomposition (the chunk prologue once per (batch, head, chunk) into
records of log2 weights lw = cum log2 e - log2 dt' (+inf where dt' = 0), cum and seg; C B^T once
per GROUP into a workspace; the per-head decay exp(cum_l - cum_s) dt'_s = 2^(cum_l log2 e - lw_s)
and the sequence mask applied when W is built, the mask only on diagonal blocks or under seq_idx;
the chunk-state weight w_s applied to x; below the diagonal of a call without seq_idx the decay
factored at the tile's first row, CB f_s times a row factor), the kernels' grids, tile loops,
early exits and tail masks, written the way the kernels do them. Workspaces, records and the
output start poisoned (NaN), so a block the model's kernels read but never wrote, or an output
element never stored, fails the comparison.

The arithmetic is float64 here (the kernels round operands to the input dtype: that is the GPU
tests' business, tests/test_ssd_gpu.py); what this checks is which terms are summed where.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashscan import reference_ssd as ref

ROWS = 64  # kRows: rows of every CTA tile
STATE_N = 128  # ssd2_chunk_state's states per CTA
K_CB = 32  # ssd2_chunk_cb's dstate step
K_STATE = 32  # ssd2_chunk_state's position step
K_SCAN = 64  # ssd2_chunk_scan's dstate step (C . H^T)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _tile(src: np.ndarray, r0: int, c0: int, rows: int, cols: int, vrows: int, vcols: int):
    """load_tile: rows x cols from src[r0:, c0:], rows >= vrows and columns >= vcols zero."""
    t = np.zeros((rows, cols))
    vr, vc = max(0, min(rows, vrows)), max(0, min(cols, vcols))
    t[:vr, :vc] = src[r0 : r0 + vr, c0 : c0 + vc]
    return t


def _prologue(dtp: np.ndarray, A: float, seqv: np.ndarray | None, c0: int, Q: int, length: int):
    """chunk_prologue: dt' (0 past the end), the in-chunk inclusive cumsum of dt' A and seg (the
    sequence starts at or before l inside the chunk), positions past the end repeating the last."""
    d = np.zeros(Q)
    d[:length] = dtp[c0 : c0 + length]
    start = np.zeros(Q, dtype=np.int64)
    if seqv is not None:
        for pos in range(length):
            t = c0 + pos
            start[pos] = seqv[t] != (seqv[t - 1] if t > 0 else 0)
    return d, np.cumsum(d * A), np.cumsum(start)


LOG2E = 1.0 / math.log(2.0)


def _log2_weight(d: np.ndarray, cum: np.ndarray) -> np.ndarray:
    """log2_weight: cum log2 e - log2 dt' where dt' > 0, else +inf (2^(x - inf) = 0)."""
    with np.errstate(divide="ignore"):
        return np.where(d > 0, cum * LOG2E - np.log2(np.where(d > 0, d, 1.0)), np.inf)


def model_forward(
    x, dt, A, B, C, Q, D=None, z=None, dt_bias=None, init=None, seq_idx=None,
    softplus=False, limit=(0.0, math.inf), ws=False,
):  # fmt: skip
    """ws: the chunk outputs as ssd2_chunk_scan_ws factors them (below the diagonal W = (CB g_l)
    f_s whole, C.H^T scaled by exp(cum_l) once, no rescale of acc before the diagonal); else as
    ssd2_chunk_scan (CB f_s, exp(cum_m0) on C.H^T, g_l on acc before the diagonal). Both only
    without seq_idx."""
    batch, L, nheads, hd_all = x.shape
    ngroups, ds = B.shape[2], B.shape[3]
    nchunks = _ceil(L, Q)
    nb = Q // ROWS
    hpg = nheads // ngroups
    dtp, _, _ = ref._dt_forward(dt, dt_bias, softplus, limit)
    nan = np.nan
    cb = np.full((batch, nchunks, ngroups, Q, Q), nan)
    states = np.full((batch, nchunks, nheads, hd_all, ds), nan)
    decay = np.full((batch, nheads, nchunks), nan)
    out = np.full(x.shape, nan)
    Dfull = (
        None if D is None else (np.broadcast_to(D[:, None], (nheads, hd_all)) if D.ndim == 1 else D)
    )

    # p. ssd2_chunk_prep: one record (lw, cum, seg) per (batch, head, chunk)
    rec_lw = np.full((batch, nheads, nchunks, Q), nan)
    rec_cum = np.full((batch, nheads, nchunks, Q), nan)
    rec_seg = np.full((batch, nheads, nchunks, Q), -1, dtype=np.int64)
    for b in range(batch):
        for h in range(nheads):
            seqv = None if seq_idx is None else seq_idx[b]
            for c in range(nchunks):
                length = min(Q, L - c * Q)
                d, cum, seg = _prologue(dtp[b, :, h], A[h], seqv, c * Q, Q, length)
                rec_lw[b, h, c], rec_cum[b, h, c], rec_seg[b, h, c] = _log2_weight(d, cum), cum, seg

    # 0. ssd2_chunk_cb: grid (nchunks * nb (nb + 1) / 2, ngroups, batch)
    for b in range(batch):
        for g in range(ngroups):
            for bx in range(nchunks * nb * (nb + 1) // 2):
                j, i = bx % (nb * (nb + 1) // 2), 0
                while j > i:
                    i += 1
                    j -= i
                c = bx // (nb * (nb + 1) // 2)
                c0 = c * Q
                length = min(Q, L - c0)
                if i * ROWS >= length:
                    continue
                acc = np.zeros((ROWS, ROWS))
                for k in range(_ceil(ds, K_CB)):
                    n0 = K_CB * k
                    tc = _tile(
                        C[b, :, g], c0 + i * ROWS, n0, ROWS, K_CB, length - i * ROWS, ds - n0
                    )
                    tb = _tile(
                        B[b, :, g], c0 + j * ROWS, n0, ROWS, K_CB, length - j * ROWS, ds - n0
                    )
                    acc += tc @ tb.T
                cb[b, c, g, i * ROWS : (i + 1) * ROWS, j * ROWS : (j + 1) * ROWS] = acc

    # 1. ssd2_chunk_state: grid (nchunks, ceil(headdim/64) * ceil(dstate/128), batch * nheads)
    ntn = _ceil(ds, STATE_N)
    for b in range(batch):
        for h in range(nheads):
            g = h // hpg
            for c in range(nchunks):
                c0 = c * Q
                length = min(Q, L - c0)
                lw, cum, seg = rec_lw[b, h, c], rec_cum[b, h, c], rec_seg[b, h, c]
                cum_end, seg_end = cum[length - 1], seg[length - 1]
                keep = (np.arange(Q) < length) & (seg == seg_end)
                w = np.where(keep, np.exp2(cum_end * LOG2E - np.where(keep, lw, 0.0)), 0.0)
                for by in range(_ceil(hd_all, 64) * ntn):
                    p0, n0 = (by // ntn) * 64, (by % ntn) * STATE_N
                    hd, dsv = hd_all - p0, ds - n0
                    acc = np.zeros((64, STATE_N))
                    for k in range(_ceil(length, K_STATE)):
                        s0 = K_STATE * k
                        tx = _tile(x[b, :, h], c0 + s0, p0, K_STATE, 64, length - s0, hd)
                        tb = _tile(B[b, :, g], c0 + s0, n0, K_STATE, STATE_N, length - s0, dsv)
                        acc += (tx * w[s0 : s0 + K_STATE, None]).T @ tb
                    vp, vn = min(64, hd), min(STATE_N, dsv)
                    states[b, c, h, p0 : p0 + vp, n0 : n0 + vn] = acc[:vp, :vn]
                    if by == 0:
                        decay[b, h, c] = np.exp(cum_end) if seg_end == 0 else 0.0

    # 2. ssd2_state_passing: H_c = state entering chunk c (the kernel leaves it in x's dtype over
    # chunk c's slot; its in-place order is replayed by _replay_state_passing below)
    final = np.zeros((batch, nheads, hd_all, ds))
    for b in range(batch):
        for h in range(nheads):
            H = np.zeros((hd_all, ds)) if init is None else init[b, h].copy()
            for c in range(nchunks):
                S = states[b, c, h].copy()
                states[b, c, h] = H
                H = decay[b, h, c] * H + S
            final[b, h] = H

    # 3. ssd2_chunk_scan: grid (nchunks * nb, ceil(headdim/64), batch * nheads)
    for b in range(batch):
        for h in range(nheads):
            g = h // hpg
            for bx in range(nchunks * nb):
                c, i = bx // nb, bx % nb
                m0, c0 = i * ROWS, c * Q
                length = min(Q, L - c0)
                if m0 >= length:
                    continue
                lw, cum, seg = rec_lw[b, h, c], rec_cum[b, h, c], rec_seg[b, h, c]
                for by in range(_ceil(hd_all, 64)):
                    p0 = by * 64
                    hd = hd_all - p0
                    acc = np.zeros((ROWS, 64))
                    # without seq_idx the blocks below the diagonal take the decay factored at
                    # row m0: exp(cum_m0) on C.H^T here, f_s = 2^(cl2_m0 - lw_s) over lw in place
                    # for s < m0, the row factor g_l = 2^(cl2_l - cl2_m0) before the diagonal
                    fast = seq_idx is None
                    if c > 0 or init is not None:
                        for n0 in range(0, ds, K_SCAN):
                            tc = _tile(C[b, :, g], c0 + m0, n0, ROWS, K_SCAN, length - m0, ds - n0)
                            th = _tile(states[b, c, h], p0, n0, 64, K_SCAN, hd, ds - n0)
                            acc += tc @ th.T
                        ls = m0 + np.arange(ROWS)
                        lc = np.minimum(ls, length - 1)
                        f = np.where((ls < length) & (seg[lc] == 0), np.exp(cum[lc]), 0.0)
                        if fast and ws:
                            acc *= np.exp(cum[lc])[:, None]
                        else:
                            acc *= math.exp(cum[m0]) if fast else f[:, None]
                    ls = m0 + np.arange(ROWS)
                    lc = np.minimum(ls, length - 1)
                    cl2 = cum[lc] * LOG2E
                    cl2_m0 = cum[m0] * LOG2E
                    g_l = np.exp2(cl2 - cl2_m0)
                    lwf = lw.copy()
                    if fast:
                        lwf[:m0] = np.exp2(cl2_m0 - lw[:m0])
                    for j in range(i + 1):
                        ss = j * ROWS + np.arange(ROWS)
                        cbb = cb[b, c, g, m0 : m0 + ROWS, j * ROWS : (j + 1) * ROWS]
                        if fast and j < i:  # accumulate_cbf_x: CB f_s; the ws kernel: (CB g_l) f_s
                            W = cbb * lwf[ss][None, :]
                            if ws:
                                W = (cbb * g_l[:, None]) * lwf[ss][None, :]
                        else:  # accumulate_wx: the mask
                            if fast and not ws:
                                acc *= g_l[:, None]
                            W = cbb * np.exp2(cl2[:, None] - lwf[ss][None, :])
                            keep = (ss[None, :] <= ls[:, None]) & (ls[:, None] < length)
                            keep &= seg[ss][None, :] == seg[lc][:, None]
                            W = np.where(keep, W, 0.0)
                        tx = _tile(x[b, :, h], c0 + j * ROWS, p0, ROWS, 64, length - j * ROWS, hd)
                        acc += W @ tx
                    # epilogue; the x of row l is the diagonal block's tile (the last one loaded)
                    vr, vc = min(ROWS, length - m0), min(64, hd)
                    y = acc[:vr, :vc]
                    if Dfull is not None:
                        y = y + Dfull[h, p0 : p0 + vc] * tx[:vr, :vc]
                    if z is not None:
                        zz = z[b, c0 + m0 : c0 + m0 + vr, h, p0 : p0 + vc]
                        y = y * zz / (1.0 + np.exp(-zz))
                    out[b, c0 + m0 : c0 + m0 + vr, h, p0 : p0 + vc] = y
    return out, final


def _case(rng, b, L, h, p, g, n, *, seq, init, D2):
    x = rng.standard_normal((b, L, h, p))
    dt = rng.standard_normal((b, L, h)) * 0.5
    A = -np.exp(rng.standard_normal(h) * 0.5)
    B = rng.standard_normal((b, L, g, n)) * 0.5
    C = rng.standard_normal((b, L, g, n)) * 0.5
    D = rng.standard_normal((h, p) if D2 else h)
    z = rng.standard_normal((b, L, h, p))
    bias = rng.standard_normal(h) * 0.3
    h0 = rng.standard_normal((b, h, p, n)) if init else None
    seq_idx = np.sort(rng.integers(0, 4, (b, L)), axis=1).astype(np.int32) if seq else None
    return x, dt, A, B, C, D, z, bias, h0, seq_idx


# (chunk, seqlen, nheads, headdim, ngroups, dstate, seq_idx, initial states, D 2-D): tails in every
# tile dimension (headdim 70: two channel blocks, the second 6 wide; dstate 136: two state tiles in
# 1, three 64-wide steps in 3; seqlen not a multiple of the chunk nor of 64 or 32), several groups.
CASES = [
    (64, 150, 4, 70, 2, 136, True, True, False),
    (128, 300, 2, 40, 1, 16, False, True, True),
    (256, 293, 4, 64, 2, 24, True, False, False),
    (256, 530, 2, 33, 2, 130, True, True, True),
    (128, 37, 2, 8, 1, 5, False, False, False),
    (64, 100, 6, 16, 2, 16, False, True, False),  # 3 heads a group, 2 groups
]


# (softplus, dt_limit): dt' in [0.01, 2], or raw dt clamped at 0 (about half the positions get
# dt' = 0, so log2 weights of +inf: weights of 0 in blocks with and without the mask)
DT_MODES = [(True, (0.01, 2.0)), (False, (0.0, math.inf))]


@pytest.mark.parametrize("ws", [False, True], ids=["scan", "scan-ws"])
@pytest.mark.parametrize("mode", DT_MODES, ids=["softplus", "clamped-at-0"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_model_matches_the_reference(case: tuple, mode: tuple, ws: bool) -> None:
    Q, L, h, p, g, n, seq, init, D2 = case
    if ws and seq:
        pytest.skip("the warp-specialised chunk outputs take calls without seq_idx")
    softplus, limit = mode
    rng = np.random.default_rng(sum(case[:6]))
    x, dt, A, B, C, D, z, bias, h0, seq_idx = _case(
        rng, 2, L, h, p, g, n, seq=seq, init=init, D2=D2
    )
    out, final = model_forward(
        x, dt, A, B, C, Q, D=D, z=z, dt_bias=bias, init=h0, seq_idx=seq_idx, softplus=softplus,
        limit=limit, ws=ws,
    )  # fmt: skip
    want, want_final = ref.mamba_chunk_scan_combined(
        x, dt, A, B, C, Q, D=D, z=z, dt_bias=bias, initial_states=h0, seq_idx=seq_idx,
        dt_softplus=softplus, dt_limit=limit, return_final_states=True,
    )  # fmt: skip
    assert not np.isnan(out).any(), "an output element was never stored or read a poisoned block"
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(final, want_final, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("ws", [False, True], ids=["scan", "scan-ws"])
def test_model_matches_the_reference_under_steep_decay(ws: bool) -> None:
    """A ~ -40 (the decay underflows within a few positions, in float64 too): the factored decay's
    f_s and g_l underflow where W does, so no inf * 0 and the sums stay the reference's (the ws
    kernel's product (CB g_l) f_s and exp(cum_l) too)."""
    Q, L, h, p, g, n = 256, 530, 2, 33, 2, 24
    rng = np.random.default_rng(7)
    x, dt, A, B, C, D, z, bias, h0, _ = _case(rng, 2, L, h, p, g, n, seq=False, init=True, D2=False)
    A = A * 40.0
    kw = dict(D=D, z=z, dt_bias=bias, dt_softplus=True, dt_limit=(0.01, 2.0))
    out, final = model_forward(
        x, dt, A, B, C, Q, D=D, z=z, dt_bias=bias, init=h0, seq_idx=None, softplus=True,
        limit=(0.01, 2.0), ws=ws,
    )  # fmt: skip
    want, want_final = ref.mamba_chunk_scan_combined(
        x, dt, A, B, C, Q, initial_states=h0, return_final_states=True, **kw
    )
    assert np.isfinite(out).all() and np.isfinite(final).all()
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(final, want_final, rtol=1e-9, atol=1e-9)


def _replay_state_passing(
    pn: int, nc: int, depth: int, threads: int = 256, reverse: bool = False
) -> None:
    """ssd2_state_passing's memory order for one (batch, head), bytes of each chunk's slot: steps
    t = k nc + c in order; the load of step t + depth - 1 is issued at step t (the vector path's
    cp.async ring of `depth` stages, kPassDepth; depth 2: the element path, one step ahead), so up
    to depth - 1 loads are in flight when step t consumes S_c of block k; after the step's barrier
    block k's 16-bit H goes over slot c. Asserted: a load never reads a byte written before it,
    nor one this step writes while it may still be in flight; a write only covers fp32 elements
    already read; every S element is read exactly once. reverse: blocks in descending order (not
    the kernel's: its 16-bit H lands on blocks not read yet), to show the replay can fail."""
    block = 4 * threads
    nblocks = _ceil(pn, block)
    steps = nblocks * nc
    reads = np.zeros((nc, pn), dtype=np.int64)
    written = np.zeros((nc, 4 * pn), dtype=bool)

    def elems(k: int) -> np.ndarray:
        return np.arange(k * block, min((k + 1) * block, pn))

    def at(t: int) -> tuple[int, int]:
        k, c = divmod(t, nc)
        return (nblocks - 1 - k if reverse else k), c

    def load(t: int) -> tuple[int, np.ndarray]:
        k, c = at(t)
        e = elems(k)
        span = (4 * e[:, None] + np.arange(4)).ravel()
        assert not written[c, span].any(), f"block {k} of chunk {c} read after being overwritten"
        reads[c, e] += 1
        return c, span

    pending = {t: load(t) for t in range(min(depth - 1, steps))}
    for t in range(steps):
        if t + depth - 1 < steps:
            pending[t + depth - 1] = load(t + depth - 1)
        pending.pop(t)  # consumed (waited for) before the barrier
        k, c = at(t)
        e = elems(k)
        span = (2 * e[:, None] + np.arange(2)).ravel()  # u16 element e: bytes 2e, 2e + 1
        assert (reads[c, np.unique(span // 4)] > 0).all(), f"block {k}: H over unread S"
        for cc, loaded in pending.values():
            if cc == c:
                assert not np.isin(loaded, span).any(), "a load in flight overlaps this write"
        written[c, span] = True
    assert (reads == 1).all()


@pytest.mark.parametrize(
    "pn, nc", [(64 * 128, 8), (8 * 16, 3), (70 * 136, 5), (33 * 130, 1), (256 * 256, 2), (5, 4)]
)
@pytest.mark.parametrize("depth", [2, 4])
def test_state_passing_overwrites_in_place_without_a_race(pn: int, nc: int, depth: int) -> None:
    _replay_state_passing(pn, nc, depth)


def test_state_passing_replay_fails_on_a_racy_order() -> None:
    """Blocks in descending order write 16-bit H over S not read yet: the replay must say so."""
    with pytest.raises(AssertionError, match="unread S"):
        _replay_state_passing(64 * 128, 3, 4, reverse=True)


def _replay_state_pass_ring(seqlen: int, kq: int, pos: int = 32, stages: int = 3) -> int:
    """ssd2_chunk_state_pass's ring (one CTA): steps t = c kq / pos + k flat over the chunks, the
    last chunk's steps only up to seqlen; thread 0 issues steps 0 .. stages - 2 before the loop and
    step t + stages - 1 at step t's top (after the barrier that ends step t - 1) into stage
    t % stages, and with a chunk's first step that chunk's record into buffer c % 2; step t waits
    for its stage, and at a chunk's first step turns the record's lw into weights in place, which
    the chunk's steps read. Asserted: a stage or record buffer is refilled only after every step
    that reads its previous contents has finished, and every step reads its own data. Returns
    the step count (the kernel's nsteps)."""
    spc = kq // pos
    nc = _ceil(seqlen, kq)
    nsteps = (nc - 1) * spc + _ceil(seqlen - (nc - 1) * kq, pos)
    stage: dict[int, int] = {}  # stage -> the step whose data it holds
    record: dict[int, int] = {}  # buffer -> the chunk whose record (or weights) it holds
    done = -1  # the last step whose reads have finished

    def issue(u: int) -> None:
        if u >= nsteps:
            return
        s = u % stages
        if s in stage:
            assert stage[s] <= done, f"step {u} refills stage {s} while step {stage[s]} reads it"
        stage[s] = u
        c, k = divmod(u, spc)
        if k == 0:
            last = record.get(c % 2)
            if last is not None:  # every step of chunk `last` reads its weights
                busy = last * spc + spc - 1 > done
                assert not busy, f"chunk {c}'s record over chunk {last}'s weights"
            record[c % 2] = c

    for u in range(stages - 1):
        issue(u)
    for t in range(nsteps):
        issue(t + stages - 1)  # (past the barrier: step t - 1 is done)
        c, _ = divmod(t, spc)
        assert stage.get(t % stages) == t, f"step {t} reads step {stage.get(t % stages)}'s stage"
        assert record.get(c % 2) == c, f"step {t} reads chunk {record.get(c % 2)}'s weights"
        done = t
    return nsteps


@pytest.mark.parametrize("kq", [64, 128, 256])
@pytest.mark.parametrize("seqlen", [1, 31, 33, 64, 65, 300, 513, 2048, 4100])
def test_fused_state_pass_ring_reuses_nothing_early(kq: int, seqlen: int) -> None:
    nsteps = _replay_state_pass_ring(seqlen, kq)
    assert nsteps == _ceil(seqlen, 32)  # (32-position steps cover every position once)


def test_fused_state_pass_ring_replay_fails_when_a_chunk_is_shorter_than_the_ring() -> None:
    """The kernel's static_assert (kSpc >= kSpStages - 1): four stages of 32 positions at chunk
    64 would issue chunk c + 2's record while chunk c's last step still reads its weights."""
    with pytest.raises(AssertionError, match="record over"):
        _replay_state_pass_ring(1000, 64, stages=4)
