"""Context parallelism over torch.distributed: ring attention and a sequence-sharded selective
scan. Each rank of a process group holds one shard of the sequence; torch.distributed moves the
shards (NCCL on GPUs, gloo on CPU); the local work is flashscan's own ops (the CUDA kernels on a
served GPU, the NumPy references on CPU, float64 tensors through the float64 references).

    from flashscan.distributed import ring_flash_attn_func, zigzag_shard
    q_local = zigzag_shard(q, rank, world)              # (batch, seqlen / world, nheads, headdim)
    out_local = ring_flash_attn_func(q_local, k_local, v_local, causal=True, layout="zigzag")

Ring attention (`ring_flash_attn_func`): the K/V shards travel around the ring (rank r sends to
r + 1, receives from r - 1) with `batch_isend_irecv`, issued before the local block is computed
so the transfer runs under the compute (NCCL moves them on its own streams; `wait` orders the
next block after the transfer on the caller's stream). Each block gives a partial output and
its log-sum-exp; partials merge exactly: lse = logaddexp(lse_a, lse_b), out = out_a *
exp(lse_a - lse) + out_b * exp(lse_b - lse), in float32 (float64 for float64 inputs). The
backward runs flashscan's attention backward per block with the merged out and lse (what the
softmax of the whole row needs), accumulates dQ locally, and sends dK/dV (float32) around the
ring with their K/V, so each shard's dK/dV arrive home after world_size steps.

Causal masks follow the global positions. With `layout="contiguous"` rank r holds positions
[r * n, (r + 1) * n): blocks above the diagonal are skipped, which leaves rank world - 1 with
world blocks and rank 0 with one. With `layout="zigzag"` the sequence is cut into 2 * world
chunks and rank r holds chunks r and 2 * world - 1 - r (`zigzag_shard`), so every rank
computes the same amount: its own two chunks causally, then per remote rank j either its queries
against j's first chunk (j < r) or its second chunk of queries against all of j's (j > r).
A sliding window (window_size) is solved per pair of position runs: the rows that see a key of
the other run and the keys they see form a box, called with the window the box needs in the
kernel's bottom-right aligned convention; pairs the window does not reach cost nothing.

Sharded scan (`sharded_selective_scan`): the recurrence runs rank after rank; rank r receives
the state after rank r - 1's shard, uses it as `initial_state`, and sends its own last state on;
the backward sends the gradient of that state back the other way. The ranks work one after the
other (the state is a true dependency); what the split buys is memory: each rank holds only its
shard's activations.

torch.distributed is imported when a function here runs, never at `import flashscan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import _checks

__all__ = [
    "ring_flash_attn_func",
    "sharded_selective_scan",
    "shard",
    "unshard",
    "zigzag_shard",
    "zigzag_unshard",
]

_LAYOUTS = ("contiguous", "zigzag")


# ---------------------------------------------------------------------------------------------
# Shard helpers (pure tensor functions; no process group needed)
# ---------------------------------------------------------------------------------------------


def shard(x: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s contiguous shard of the full sequence `x` along `dim` (the sequence
    dimension: 1 for attention's (batch, seqlen, nheads, headdim), -1 for the scan's
    (batch, dim, seqlen)). The length must divide by world_size."""
    n = _shard_len(x, world_size, dim, 1)
    return x.narrow(dim, rank * n, n)


def unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's contiguous shard (in rank order)."""
    return torch.cat(shards, dim=dim)


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s zig-zag shard of the full sequence `x` along `dim`: of 2 * world_size
    equal chunks, chunk `rank` followed by chunk `2 * world_size - 1 - rank` (balances causal
    attention's work over the ranks). The length must divide by 2 * world_size."""
    c = _shard_len(x, world_size, dim, 2)
    first = x.narrow(dim, rank * c, c)
    second = x.narrow(dim, (2 * world_size - 1 - rank) * c, c)
    return torch.cat([first, second], dim=dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's zig-zag shard (in rank order)."""
    world = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    ordered = [halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))]
    return torch.cat(ordered, dim=dim)


def _shard_len(x: torch.Tensor, world_size: int, dim: int, per_rank: int) -> int:
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    n = x.shape[dim]
    parts = world_size * per_rank
    if n % parts:
        what = "2 * world_size" if per_rank == 2 else "world_size"
        raise ValueError(f"x: sequence length {n} (dim {dim}) does not divide by {what} = {parts}")
    return n // parts


# ---------------------------------------------------------------------------------------------
# The ring: peers, and one step's P2P exchange
# ---------------------------------------------------------------------------------------------


class _Ring:
    """This rank's place in `group`: its rank, the world size and its neighbours' global ranks
    (P2P calls take global ranks)."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "flashscan.distributed needs an initialised torch.distributed process group "
                "(torch.distributed.init_process_group)"
            )
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        g = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(g, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(g, (self.rank - 1) % self.world)

    def pass_on(
        self, tensors: tuple[torch.Tensor, ...], tag: int = 0
    ) -> tuple[list[Any], list[torch.Tensor]]:
        """Starts sending `tensors` to the next rank and receiving the previous rank's into new
        buffers; returns (requests, buffers). Tensor i goes with tag `tag + i`: gloo matches
        messages by tag (two exchanges in flight at once need distinct tags), NCCL by order
        (every rank issues the exchanges in the same order)."""
        if self.world == 1:  # our own shard comes back to us
            return [], list(tensors)
        dist = self.dist
        bufs = [torch.empty_like(t) for t in tensors]
        ops = [
            dist.P2POp(dist.isend, t, self.next, self.group, tag + i) for i, t in enumerate(tensors)
        ]
        ops += [
            dist.P2POp(dist.irecv, b, self.prev, self.group, tag + i) for i, b in enumerate(bufs)
        ]
        return dist.batch_isend_irecv(ops), bufs


def _wait(reqs: list[Any]) -> None:
    for r in reqs:
        r.wait()


# ---------------------------------------------------------------------------------------------
# Ring attention
# ---------------------------------------------------------------------------------------------

_ALL = slice(None)
# P2P tags of the two exchanges the backward keeps in flight together
_KV_TAG, _DKV_TAG = 0, 2


def _block(
    rank: int, src: int, world: int, causal: bool, layout: str, n: int
) -> tuple[slice, slice, int, int] | None:
    """What rank `rank`'s queries do with rank `src`'s keys (n rows per shard): (query rows,
    key rows, window_left, window_right) of one local attention call, or None when every pair
    is masked. Global self-attention masks translated into local ones (see the module doc)."""
    if not causal:
        return _ALL, _ALL, -1, -1
    if src == rank:
        # the diagonal: local order is global order in both layouts, so a local causal mask
        # (seqlen_q == seqlen_k, aligned) is the global one
        return _ALL, _ALL, -1, 0
    if layout == "contiguous":
        return (_ALL, _ALL, -1, -1) if src < rank else None
    half = n // 2
    if src < rank:  # both of our chunks come after src's first chunk, before its second
        return _ALL, slice(0, half), -1, -1
    return slice(half, n), _ALL, -1, -1  # only our second chunk comes after both of src's


def _segments(rank: int, world: int, layout: str, n: int) -> list[tuple[int, int, int]]:
    """Rank `rank`'s shard as runs of consecutive global positions: (local start, global
    start, length)."""
    if layout == "contiguous":
        return [(0, rank * n, n)]
    c = n // 2
    return [(0, rank * c, c), (c, (2 * world - 1 - rank) * c, c)]


def _window_blocks(
    rank: int, src: int, world: int, layout: str, n: int, wl: int, wr: int
) -> list[tuple[slice, slice, int, int]]:
    """The local calls of rank `rank`'s queries against rank `src`'s keys under the global
    mask kp - qp in [-wl, wr] (-1: unbounded), one per pair of runs that has a visible pair:
    the rows that see a key and the keys they see, as a tight box, and the window that box
    needs in the kernel's bottom-right aligned convention (both edges come out >= 0: the
    box's corner rows touch the band)."""
    inf = float("inf")
    lo = -wl if wl >= 0 else -inf
    hi = wr if wr >= 0 else inf
    calls = []
    for qloc, qa, lq in _segments(rank, world, layout, n):
        for kloc, ka, lk in _segments(src, world, layout, n):
            # rows that see a key of [ka, ka + lk): ka - hi <= qp <= ka + lk - 1 - lo
            q0 = int(max(qa, ka - hi))
            q1 = int(min(qa + lq - 1, ka + lk - 1 - lo))
            if q0 > q1:
                continue
            k0 = int(max(ka, q0 + lo))
            k1 = int(min(ka + lk - 1, q1 + hi))
            off = (k1 - k0) - (q1 - q0)  # seqlen_k - seqlen_q of the box
            left = -1 if wl < 0 else off - int(lo) + k0 - q0
            right = -1 if wr < 0 else int(hi) - (k0 - q0) - off
            rows = slice(qloc + q0 - qa, qloc + q1 - qa + 1)
            cols = slice(kloc + k0 - ka, kloc + k1 - ka + 1)
            calls.append((rows, cols, left, right))
    return calls


def _blocks(
    rank: int, src: int, world: int, causal: bool, layout: str, n: int, window: tuple[int, int]
) -> list[tuple[slice, slice, int, int]]:
    """Every local call of one ring step: without a sliding window the fixed cases of
    `_block` (one call each), else the general boxes of `_window_blocks`."""
    if window == (-1, 0 if causal else -1):
        blk = _block(rank, src, world, causal, layout, n)
        return [] if blk is None else [blk]
    return _window_blocks(rank, src, world, layout, n, *window)


def _lse_rows(lse: torch.Tensor, rows: slice) -> torch.Tensor:
    return lse if rows == _ALL else lse[:, :, rows]


def _merge(
    out: torch.Tensor, lse: torch.Tensor, rows: slice, o_b: torch.Tensor, lse_b: torch.Tensor
) -> None:
    """Folds a block's partial (o_b, lse_b) into the running (out, lse) rows, in place.
    out: (batch, seqlen, nheads, headdim), lse: (batch, nheads, seqlen), both in the
    accumulation dtype. Rows no key reached so far keep lse = -inf and out = 0."""
    o_cur = out[:, rows]
    l_cur = _lse_rows(lse, rows)
    lse_b = lse_b.to(lse.dtype)
    new = torch.logaddexp(l_cur, lse_b)
    # -inf - -inf is NaN: rows with no key yet (in both parts) get weights exp(-inf) = 0
    base = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    w_cur = torch.exp(l_cur - base).transpose(1, 2).unsqueeze(-1)
    w_b = torch.exp(lse_b - base).transpose(1, 2).unsqueeze(-1)
    o_cur.mul_(w_cur).add_(o_b.to(out.dtype) * w_b)
    l_cur.copy_(new)


def _accum_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _ops() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The torch adapter's eager forward (-> out, lse) and backward (-> dq, dk, dv) of one
    attention call: the CUDA kernels on a served GPU, the references on CPU (float64 tensors in
    float64). Called directly rather than through torch.ops.flashscan: the ring runs inside its
    own autograd.Function, and a custom op's first call costs seconds of dispatcher set-up."""
    from .torch import _attn_bwd_impl, _attn_fwd_impl

    return _attn_fwd_impl, _attn_bwd_impl


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ring: _Ring,
        scale: float,
        causal: bool,
        layout: str,
        softcap: float,
        window: tuple[int, int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_fwd, _ = _ops()
        b, n, h, d = q.shape
        acc = _accum_dtype(q)
        out = q.new_zeros((b, n, h, v.shape[-1]), dtype=acc)
        lse = q.new_full((b, h, n), float("-inf"), dtype=acc)
        kv = (k, v)
        for step in range(ring.world):
            last = step + 1 == ring.world
            # the next shard is on its way while this one is computed
            reqs, incoming = ([], []) if last else ring.pass_on(kv, _KV_TAG)
            src = (ring.rank - step) % ring.world
            for rows, cols, wl, wr in _blocks(
                ring.rank, src, ring.world, causal, layout, n, window
            ):
                o_b, lse_b = attn_fwd(
                    q[:, rows], kv[0][:, cols], kv[1][:, cols], scale, wl, wr, softcap, False
                )
                _merge(out, lse, rows, o_b, lse_b)
            _wait(reqs)
            if not last:
                kv = (incoming[0], incoming[1])
        out = out.to(q.dtype)
        lse = lse.float() if q.dtype != torch.float64 else lse
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (ring, scale, causal, layout, softcap, window)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor) -> tuple[Any, ...]:
        _, attn_bwd = _ops()
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale, causal, layout, softcap, window = ctx.args
        n = q.shape[1]
        acc = _accum_dtype(q)
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=acc)
        # this rank's accumulators for the shard it holds; they travel with it
        dkv = (torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc))
        kv = (k, v)
        dkv_reqs: list[Any] = []
        dkv_in: list[torch.Tensor] = []
        for step in range(ring.world):
            last = step + 1 == ring.world
            kv_reqs, kv_in = ([], []) if last else ring.pass_on(kv, _KV_TAG)
            src = (ring.rank - step) % ring.world
            grads = []
            for rows, cols, wl, wr in _blocks(
                ring.rank, src, ring.world, causal, layout, n, window
            ):
                g = attn_bwd(
                    dout[:, rows],
                    q[:, rows],
                    kv[0][:, cols],
                    kv[1][:, cols],
                    out[:, rows],
                    _lse_rows(lse, rows).contiguous(),
                    scale,
                    wl,
                    wr,
                    softcap,
                    False,
                )
                grads.append((rows, cols, g))
            # the accumulators of this shard arrive from the previous rank (step 0: our own)
            _wait(dkv_reqs)
            if step > 0:
                dkv = (dkv_in[0], dkv_in[1])
            for rows, cols, (dq_b, dk_b, dv_b) in grads:
                dq[:, rows] += dq_b
                dkv[0][:, cols] += dk_b
                dkv[1][:, cols] += dv_b
            dkv_reqs, dkv_in = ring.pass_on(dkv, _DKV_TAG)
            _wait(kv_reqs)
            if not last:
                kv = (kv_in[0], kv_in[1])
        # after world_size passes our own shard's accumulators are home
        _wait(dkv_reqs)
        dk, dv = dkv_in
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), *([None] * 6)


def ring_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    layout: str = "contiguous",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a sequence split across the ranks of `group` (default: the world):
    `flashscan.flash_attn_func` of the whole sequence, each rank holding and receiving its
    shard. Differentiable (q, k, v).

    q, k, v: this rank's shard, (batch, seqlen_local, nheads, headdim) and (batch,
    seqlen_local, nheads_k, headdim), self-attention (the same positions for q and k);
    seqlen_local the same on every rank (even for layout="zigzag"). layout: "contiguous"
    (rank r holds rows [r * n, (r + 1) * n), `shard`) or "zigzag" (`zigzag_shard`: the same
    causal work on every rank). causal, softmax_scale, window_size, softcap: as flash_attn_func,
    over global positions (a sliding window runs only the shard pairs it reaches, each as the
    tight box of rows and keys it covers).

    Returns this rank's rows of out (like q) and with return_lse=True (out, lse), lse (batch,
    nheads, seqlen_local) float32 (float64 for float64 inputs). Every rank of the group must
    call it with the same shapes and options (and run the backward, when one runs).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: ring_flash_attn_func takes torch tensors, got {type(t)}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected (batch, seqlen, nheads, headdim), got {t.shape}")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {_LAYOUTS}")
    if q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
        raise ValueError(
            f"q, k, v: ring attention is self-attention over one sharded sequence; seqlen "
            f"{q.shape[1]}, {k.shape[1]}, {v.shape[1]} must be equal"
        )
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(
            f"q: a zig-zag shard holds two equal chunks; seqlen_local {q.shape[1]} is odd"
        )
    window = _checks.window(window_size, bool(causal))
    scale = 1.0 / q.shape[-1] ** 0.5 if softmax_scale is None else float(softmax_scale)
    ring = _Ring(group)
    out, lse = _RingAttention.apply(
        q, k, v, ring, scale, bool(causal), layout, float(softcap), window
    )
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Sharded selective scan
# ---------------------------------------------------------------------------------------------


class _ShardedScan(torch.autograd.Function):
    """One rank's shard of the scan. The forward receives the state from the previous rank,
    scans with it as initial_state (building the local autograd graph of
    flashscan.torch.selective_scan_fn), sends its last state on; the backward receives the
    last state's gradient from the next rank, backpropagates the local graph, and sends the
    initial state's gradient back."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        ring: _Ring,
        delta_softplus: bool,
        u: torch.Tensor,
        delta: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor | None,
        z: torch.Tensor | None,
        delta_bias: torch.Tensor | None,
        initial_state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from .torch import selective_scan_fn

        dist = ring.dist
        batch, dim = u.shape[0], u.shape[1]
        dstate = A.shape[-1]
        state_dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
        first = ring.rank == 0
        if first:
            h_in = initial_state
        else:
            h_in = u.new_empty((batch, dim, dstate), dtype=state_dtype)
            dist.recv(h_in, ring.prev, ring.group)
        inputs = (u, delta, A, B, C, D, z, delta_bias, h_in)
        # a received state always needs its gradient: the previous rank waits for it
        needs = [t is not None and need for t, need in zip(inputs, ctx.needs_input_grad[2:])]
        if not first and any(needs):
            needs[8] = True
        leaves = [
            None if t is None else t.detach().requires_grad_(need) for t, need in zip(inputs, needs)
        ]
        with torch.enable_grad():
            out, last = selective_scan_fn(
                *leaves[:8],
                delta_softplus=delta_softplus,
                return_last_state=True,
                initial_state=leaves[8],
            )
        if ring.rank + 1 < ring.world:
            dist.send(last.detach().contiguous(), ring.next, ring.group)
        ctx.ring = ring
        ctx.graph = (out, last, leaves, needs)
        return out.detach(), last.detach()

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor | None, dlast: torch.Tensor | None) -> Any:
        ring = ctx.ring
        dist = ring.dist
        out, last, leaves, needs = ctx.graph
        ctx.graph = None
        dlast_total = torch.zeros_like(last) if dlast is None else dlast.to(last.dtype).clone()
        if ring.rank + 1 < ring.world:
            from_next = torch.empty_like(last)
            dist.recv(from_next, ring.next, ring.group)
            dlast_total += from_next
        if dout is None:
            dout = torch.zeros_like(out)
        wanted = [leaf for leaf, need in zip(leaves, needs) if need]
        grads = torch.autograd.grad((out, last), wanted, (dout, dlast_total), allow_unused=True)
        by_leaf = iter(grads)
        full = [next(by_leaf) if need else None for need in needs]
        if ring.rank > 0:
            dh = full[8]
            if dh is None:
                dh = torch.zeros_like(leaves[8])
            dist.send(dh.contiguous(), ring.prev, ring.group)
            full[8] = None  # the received state is no input of ours
        return (None, None, *full)


class _AllGather(torch.autograd.Function):
    """x of every rank, stacked (world, ...); the backward sums each slot's gradient over the
    ranks (all_reduce) and keeps this rank's."""

    @staticmethod
    def forward(ctx: Any, ring: _Ring, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.ring = ring
        x = x.contiguous()
        if ring.world == 1:
            return x.unsqueeze(0).clone()
        parts = [torch.empty_like(x) for _ in range(ring.world)]
        ring.dist.all_gather(parts, x, group=ring.group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[None, torch.Tensor]:
        ring = ctx.ring
        g = g.contiguous().clone()
        if ring.world > 1:
            ring.dist.all_reduce(g, group=ring.group)
        return None, g[ring.rank]


def _parallel_scan(
    ring: _Ring,
    args: tuple[Any, ...],
    delta_softplus: bool,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan is linear in its state and A is diagonal: the state after a shard is
    decay * (state before) + (the shard's last state from zero), decay = exp(A * sum_t dt) per
    (batch, channel, state). Every rank computes its own (last state, decay) at once (rank 0
    from the initial state, the others from zero), all-gathers them, folds ranks 0..r-1 into
    its initial state, and scans again from it (rank 0's first scan is already final).
    Differentiable end to end (autograd through the scans, the fold and the all-gather)."""
    from .torch import selective_scan_fn

    u, delta, A, B, C, D, z, delta_bias = args
    acc = torch.float64 if u.dtype == torch.float64 else torch.float32
    first = ring.rank == 0
    # the shard's last state from a zero state; on rank 0 from the true initial state, which
    # makes its scan final (the others leave out D and z, which do not touch the state)
    out, last = selective_scan_fn(
        u,
        delta,
        A,
        B,
        C,
        D if first else None,
        z if first else None,
        delta_bias,
        delta_softplus,
        return_last_state=True,
        initial_state=initial_state if first else None,
    )
    dt = delta.to(acc)
    if delta_bias is not None:
        dt = dt + delta_bias.to(acc)[:, None]
    if delta_softplus:
        dt = torch.nn.functional.softplus(dt)  # threshold 20, as the kernels and references
    decay = torch.exp(A.to(acc)[None] * dt.sum(-1)[..., None])
    gathered = _AllGather.apply(ring, torch.stack([last.to(acc), decay]))
    # every rank's backward must reach the all-gather (its all_reduce is collective), rank 0's
    # too, whose result depends on no other rank: an empty slice ties it in, adding 0
    tie = gathered[..., :0].sum()
    if first:  # tied into out, which every loss uses (the last state only on the last rank)
        return out + tie.to(out.dtype), last + tie
    state = gathered[0, 0]
    for j in range(1, ring.rank):
        state = gathered[j, 1] * state + gathered[j, 0]
    return selective_scan_fn(  # type: ignore[return-value]
        u,
        delta,
        A,
        B,
        C,
        D,
        z,
        delta_bias,
        delta_softplus,
        return_last_state=True,
        initial_state=state + tie,
    )


def sharded_selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: torch.Tensor | None = None,
    group: Any = None,
    method: str = "serial",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`flashscan.selective_scan_fn` over a sequence split across the ranks of `group` (rank
    r holds time steps [r * n, (r + 1) * n): `shard(x, rank, world, dim=-1)`), differentiable.

    u, delta, z and time-varying B, C: this rank's shard along the last (time) dimension, the
    same length on every rank; A, D, delta_bias and time-invariant B, C: the full parameters on
    every rank. initial_state: read on rank 0 only (the state before the whole sequence).
    Returns this rank's out, and with return_last_state=True (out, last_state): the state after
    this rank's shard (on the last rank, the state after the whole sequence). Gradients of
    the parameters are each rank's share: sum them over the group as data parallelism does.

    method: "serial" passes the state rank to rank (one scan per rank, the ranks one after
    another); "parallel" scans every shard at once from a zero state, all-gathers each shard's
    last state and decay exp(A * sum(dt)), folds them into each rank's true initial state, and
    scans again from it (two scans per rank, all ranks at once: faster from 3 ranks up).
    """
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: sharded_selective_scan takes torch tensors, got {type(t)}")
    if u.dim() != 3 or A.dim() != 2:
        raise ValueError(
            f"u, A: expected u (batch, dim, seqlen) and A (dim, dstate), got {u.shape}, {A.shape}"
        )
    if method not in ("serial", "parallel"):
        raise ValueError(f"method: {method!r} is not one of ('serial', 'parallel')")
    ring = _Ring(group)
    if method == "parallel":
        out, last = _parallel_scan(
            ring,
            (u, delta, A, B, C, D, z, delta_bias),
            bool(delta_softplus),
            initial_state if ring.rank == 0 else None,
        )
        return (out, last) if return_last_state else out
    out, last = _ShardedScan.apply(
        ring,
        bool(delta_softplus),
        u,
        delta,
        A,
        B,
        C,
        D,
        z,
        delta_bias,
        initial_state if ring.rank == 0 else None,
    )
    return (out, last) if return_last_state else out
