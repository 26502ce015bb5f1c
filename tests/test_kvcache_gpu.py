"""GPU tests of the KV-cache native core: `_native.kvcache_append` and `_native.flash_attn_kvcache`
called directly (descriptor tuples, and DLPack for one case) with torch tensors, against a float64
torch reference written here (attention over each sequence's cache rows [leftpad, seqlens_k) with
bottom-right causal / window masks and softcap; append + rotary).

The correctness rule of DESIGN.md: float64 reference, error <= 2x that of the same computation in
the inputs' precision + a small slack, NaN-poisoned outputs (an unwritten element shows), odd
sizes. Covers contiguous and paged caches (page sizes 16, 64, 256), batch 1 / 7 / 32, seqlen_q
1 / 4 / 13, cache lengths 0 (no key: out 0, lse -inf), 1, 63, 1000, 4097, GQA 1 / 4 / 8, forced
splits 1..max and the heuristic (0), causal / window / softcap, head dims 64 / 80 / 128 / 256,
bf16 and fp16, cache_batch_idx and cache_leftpad, the cache after append (bit-exact where it is a
copy), bad device indices (NaN rows, never a fault), and a CUDA-graph capture of a decode step.
Kept small: the variants touched compile once (NVRTC, disk-cached), each case runs in milliseconds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from flashscan import _native  # noqa: E402

pytestmark = pytest.mark.gpu

NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.int32: "int32",
}
NAN = float("nan")


def desc(t: Any) -> Any:
    """The descriptor tuple the Python layer's torch fast path passes (None stays None)."""
    if t is None:
        return None
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), NAMES[t.dtype], 2, t.get_device())


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def gen() -> Any:
    g = torch.Generator(device="cuda")
    g.manual_seed(random.getrandbits(62))
    return g


def randn(shape: tuple[int, ...], dtype: Any, g: Any) -> Any:
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------------------------------------
# caches: contiguous or paged, and the logical (batch, capacity, nheads_k, d) view of either
# ---------------------------------------------------------------------------------------------


@dataclass
class Cache:
    k: Any  # (batch_cache, cap, hk, d) or (num_blocks, page, hk, d)
    v: Any
    block_table: Any | None  # (batch, max_blocks) int32
    cache_batch_idx: Any | None  # (batch,) int32
    capacity: int
    rows: list[int] = field(default_factory=list)  # contiguous: cache row of each batch

    def logical(self, t: Any) -> Any:
        """(batch, capacity, hk, d): what sequence b sees, through block_table / cache_batch_idx."""
        if self.block_table is not None:
            b, nb = self.block_table.shape
            return t[self.block_table.long()].reshape(b, nb * t.shape[1], *t.shape[2:])
        return t[torch.tensor(self.rows, device="cuda")]


def make_cache(
    batch: int,
    cap: int,
    hk: int,
    d: int,
    dtype: Any,
    page: int | None,
    g: Any,
    batch_idx: bool = False,
) -> Cache:
    if page is None:
        rows = list(range(batch))
        bc = batch
        cbi = None
        if batch_idx:  # a permutation into a larger cache
            bc = batch + 3
            rows = random.sample(range(bc), batch)
            cbi = torch.tensor(rows, dtype=torch.int32, device="cuda")
        k, v = randn((bc, cap, hk, d), dtype, g), randn((bc, cap, hk, d), dtype, g)
        return Cache(k, v, None, cbi, cap, rows)
    nb = -(-cap // page)
    num_blocks = batch * nb + 5  # spare blocks that nobody maps
    perm = torch.randperm(num_blocks, device="cuda")[: batch * nb]
    table = perm.reshape(batch, nb).to(torch.int32).contiguous()
    k, v = randn((num_blocks, page, hk, d), dtype, g), randn((num_blocks, page, hk, d), dtype, g)
    return Cache(k, v, table, None, nb * page)


# ---------------------------------------------------------------------------------------------
# the references
# ---------------------------------------------------------------------------------------------


def attention_ref(
    q: Any,
    k: Any,
    v: Any,
    seqlens: Any,
    leftpad: Any | None,
    scale: float,
    window: tuple[int, int],
    softcap: float,
    upcast: bool,
) -> tuple[Any, Any]:
    """(out, lse) of q (b, sq, h, d) over the logical caches k / v (b, cap, hk, d): keys
    [leftpad[b], seqlens[b]) attend, query i at key position seqlens[b] - sq + i. upcast: float64
    (reference); else in q's dtype (scores and P rounded, softmax in float32: the baseline)."""
    dt = torch.float64 if upcast else q.dtype
    b, sq, h, d = q.shape
    cap, hk = k.shape[1], k.shape[2]
    k = k.to(dt).repeat_interleave(h // hk, dim=2)
    v = v.to(dt).repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(dt), k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    hi = seqlens.long().clamp(0, cap)[:, None, None]
    lo = (leftpad.long() if leftpad is not None else torch.zeros_like(seqlens).long())[
        :, None, None
    ]
    lo = torch.minimum(lo.clamp(min=0), hi)
    j = torch.arange(cap, device="cuda")[None, None, :]
    qpos = hi - sq + torch.arange(sq, device="cuda")[None, :, None]
    vis = ((j >= lo) & (j < hi)).expand(b, sq, cap).clone()  # (b, sq, cap)
    if window[0] >= 0:
        vis &= j >= qpos - window[0]
    if window[1] >= 0:
        vis &= j <= qpos + window[1]
    s = s.masked_fill(~vis[:, None], float("-inf"))
    sm = s if upcast else s.float()
    lse = torch.logsumexp(sm, dim=-1)
    p = torch.nan_to_num(torch.softmax(sm, dim=-1), nan=0.0).to(dt)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def rotary_ref(x: Any, cos: Any, sin: Any, pos: Any, interleaved: bool, upcast: bool) -> Any:
    """x (b, s, h, d) rotated at integer positions pos (b, s); float64 or in x's dtype."""
    dt = torch.float64 if upcast else x.dtype
    rd = 2 * cos.shape[1]
    c = cos.to(dt)[pos.long()][:, :, None, :]
    s = sin.to(dt)[pos.long()][:, :, None, :]
    xr, rest = x.to(dt)[..., :rd], x.to(dt)[..., rd:]
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        o = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., : rd // 2], xr[..., rd // 2 :]
        o = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((o, rest), dim=-1)


# ---------------------------------------------------------------------------------------------
# calls
# ---------------------------------------------------------------------------------------------


def run_attention(
    q: Any,
    cache: Cache,
    seqlens: Any,
    leftpad: Any | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_splits: int = 0,
    scale: float | None = None,
    via_dlpack: bool = False,
) -> tuple[Any, Any]:
    b, sq, h, d = q.shape
    out = torch.full_like(q, NAN)
    lse = torch.full((b, h, sq), NAN, dtype=torch.float32, device="cuda")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    wrap = (lambda t: t) if via_dlpack else desc
    _native.flash_attn_kvcache(
        wrap(q),
        wrap(cache.k),
        wrap(cache.v),
        wrap(out),
        wrap(lse),
        wrap(seqlens),
        None if cache.cache_batch_idx is None else wrap(cache.cache_batch_idx),
        None if leftpad is None else wrap(leftpad),
        None if cache.block_table is None else wrap(cache.block_table),
        scale,
        window[0],
        window[1],
        softcap,
        num_splits,
        stream(),
    )
    return out, lse


def check_attention(
    rule: Any,
    q: Any,
    cache: Cache,
    seqlens: Any,
    leftpad: Any | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_splits: int = 0,
    via_dlpack: bool = False,
) -> None:
    out, lse = run_attention(
        q, cache, seqlens, leftpad, window, softcap, num_splits, via_dlpack=via_dlpack
    )
    scale = 1.0 / math.sqrt(q.shape[-1])
    k, v = cache.logical(cache.k), cache.logical(cache.v)
    ref_o, ref_l = attention_ref(q, k, v, seqlens, leftpad, scale, window, softcap, upcast=True)
    base_o, base_l = attention_ref(q, k, v, seqlens, leftpad, scale, window, softcap, upcast=False)
    slack = 1e-5 * max(1.0, float(ref_o.abs().max()))
    rule.check(out, ref_o, base_o, atol=slack, name=f"out ({q.dtype}, splits={num_splits})")
    rule.check(lse, ref_l, base_l, atol=1e-4, name="lse")


def lengths(batch: int, cap: int, must: list[int]) -> Any:
    """Ragged int32 cache lengths in [0, cap]: `must` first (clamped), then random."""
    ls = [min(m, cap) for m in must][:batch]
    ls += [random.randint(1, cap) for _ in range(batch - len(ls))]
    return torch.tensor(ls, dtype=torch.int32, device="cuda")


# ---------------------------------------------------------------------------------------------
# attention: the sampled matrix
# ---------------------------------------------------------------------------------------------

# (batch, seqlen_q, nheads, nheads_k, d, dtype, cap, page, mask, splits)
#   mask: (causal-window (left, right) or None, softcap)
CAUSAL = ((-1, 0), 0.0)
NONE = ((-1, -1), 0.0)
CASES = [
    (1, 1, 32, 8, 128, torch.bfloat16, 4097, None, CAUSAL, 0),
    (1, 1, 32, 8, 128, torch.bfloat16, 4097, 16, CAUSAL, 0),
    (7, 4, 8, 2, 128, torch.float16, 1000, 64, ((100, 0), 0.0), 3),
    (32, 1, 8, 8, 64, torch.bfloat16, 63, None, NONE, 1),
    (32, 1, 8, 8, 64, torch.bfloat16, 1000, 256, CAUSAL, 0),
    (7, 13, 16, 2, 128, torch.bfloat16, 1000, 256, CAUSAL, 0),
    (3, 1, 8, 1, 256, torch.bfloat16, 1000, 64, ((-1, -1), 30.0), 4),
    (2, 13, 4, 1, 256, torch.float16, 300, 16, ((40, 2), 5.0), 2),
    (7, 4, 16, 4, 64, torch.float16, 4097, 64, ((-1, 0), 0.0), 0),
]


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: (
        f"b{c[0]}-sq{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-{NAMES[c[5]]}-cap{c[6]}-page{c[7]}-s{c[9]}"
    ),
)
def test_attention_matrix(rule: Any, case: tuple) -> None:
    b, sq, h, hk, d, dtype, cap, page, (window, softcap), splits = case
    g = gen()
    cache = make_cache(b, cap, hk, d, dtype, page, g)
    seqlens = lengths(b, cache.capacity, [cap, 0, 1, 63, 1000, cap - 1])
    q = randn((b, sq, h, d), dtype, g)
    check_attention(rule, q, cache, seqlens, None, window, softcap, splits)


@pytest.mark.parametrize("splits", [1, 2, 3, 5, 8, 32, 64, 1000, 0])
def test_every_split_count_matches(rule: Any, splits: int) -> None:
    # 2048 keys = 32 blocks of 64: 1000 is clamped to the block count
    g = gen()
    cache = make_cache(2, 2048, 2, 128, torch.bfloat16, None, g)
    seqlens = torch.tensor([2048, 777], dtype=torch.int32, device="cuda")
    q = randn((2, 1, 8, 128), torch.bfloat16, g)
    check_attention(rule, q, cache, seqlens, num_splits=splits)


def test_padded_head_dim_leftpad_and_batch_idx(rule: Any) -> None:
    # hd 80 runs in the 96 tile; sequences start after leftpad; cache rows permuted
    g = gen()
    cache = make_cache(4, 300, 1, 80, torch.float16, None, g, batch_idx=True)
    seqlens = torch.tensor([300, 5, 200, 64], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([17, 5, 0, 63], dtype=torch.int32, device="cuda")  # b1, b3: no key left
    q = randn((4, 4, 4, 80), torch.float16, g)
    for splits in (1, 3):
        check_attention(rule, q, cache, seqlens, leftpad, (-1, 0), 0.0, splits)
        check_attention(rule, q, cache, seqlens, leftpad, (7, -1), 0.0, splits)


def test_no_key_gives_zero_and_minus_inf() -> None:
    g = gen()
    for page, splits in ((None, 1), (16, 4)):
        cache = make_cache(3, 128, 2, 64, torch.bfloat16, page, g)
        seqlens = torch.zeros(3, dtype=torch.int32, device="cuda")
        q = randn((3, 2, 4, 64), torch.bfloat16, g)
        out, lse = run_attention(q, cache, seqlens, num_splits=splits)
        assert torch.equal(out, torch.zeros_like(out))
        assert bool((lse == float("-inf")).all())


def test_paged_equals_contiguous() -> None:
    # the same logical cache, paged (16 / 64 / 256) and contiguous: the same result (same
    # arithmetic in the same order; splits fixed so the key ranges match)
    g = gen()
    b, cap, hk, d = 3, 1024, 2, 128
    cont = make_cache(b, cap, hk, d, torch.bfloat16, None, g)
    seqlens = torch.tensor([1024, 1, 500], dtype=torch.int32, device="cuda")
    q = randn((b, 1, 8, d), torch.bfloat16, g)
    ref_o, ref_l = run_attention(q, cont, seqlens, num_splits=4)
    for page in (16, 64, 256):
        paged = make_cache(b, cap, hk, d, torch.bfloat16, page, g)
        nb = cap // page
        flat_k = paged.k.view(-1, page, hk, d)
        flat_v = paged.v.view(-1, page, hk, d)
        for bi in range(b):
            for j in range(nb):
                blk = int(paged.block_table[bi, j])
                flat_k[blk] = cont.k[bi, j * page : (j + 1) * page]
                flat_v[blk] = cont.v[bi, j * page : (j + 1) * page]
        out, lse = run_attention(q, paged, seqlens, num_splits=4)
        assert torch.equal(out, ref_o), f"page {page}"
        assert torch.equal(lse, ref_l), f"page {page}"


def test_dlpack_inputs(rule: Any) -> None:
    g = gen()
    cache = make_cache(2, 200, 2, 64, torch.bfloat16, 16, g)
    seqlens = torch.tensor([200, 33], dtype=torch.int32, device="cuda")
    q = randn((2, 1, 4, 64), torch.bfloat16, g)
    check_attention(rule, q, cache, seqlens, via_dlpack=True)


def test_bad_device_indices_give_nan_rows_not_faults() -> None:
    g = gen()
    # paged: batch 1's table points past num_blocks; batch 0 stays correct
    cache = make_cache(2, 256, 2, 64, torch.bfloat16, 64, g)
    good = cache.block_table.clone()
    cache.block_table[1, 1] = 10_000
    seqlens = torch.tensor([256, 256], dtype=torch.int32, device="cuda")
    q = randn((2, 1, 4, 64), torch.bfloat16, g)
    for splits in (1, 3):
        out, lse = run_attention(q, cache, seqlens, num_splits=splits)
        assert bool(out[1].isnan().all()) and bool(lse[1].isnan().all())
        cache_ok = Cache(cache.k, cache.v, good, None, cache.capacity)
        ref_o, _ = run_attention(q, cache_ok, seqlens, num_splits=splits)
        assert torch.equal(out[0], ref_o[0])
    # contiguous: cache_batch_idx out of range; seqlens past the capacity are clamped
    cache = make_cache(2, 100, 2, 64, torch.bfloat16, None, g, batch_idx=True)
    cache.cache_batch_idx[0] = -3
    seqlens = torch.tensor([50, 5000], dtype=torch.int32, device="cuda")
    out, lse = run_attention(q, cache, seqlens)
    assert bool(out[0].isnan().all())
    clamped = torch.tensor([50, 100], dtype=torch.int32, device="cuda")
    k, v = cache.logical(cache.k), cache.logical(cache.v)
    ref_o, _ = attention_ref(q[1:], k[1:], v[1:], clamped[1:], None, 0.125, (-1, -1), 0.0, True)
    assert float((out[1:].double() - ref_o).abs().max()) < 2e-2


def test_bad_arguments_are_clear_errors() -> None:
    g = gen()
    cache = make_cache(2, 64, 2, 64, torch.bfloat16, None, g)
    q = randn((2, 1, 4, 64), torch.bfloat16, g)
    out = torch.empty_like(q)
    seqlens = torch.ones(2, dtype=torch.int32, device="cuda")

    def call(**over: Any) -> None:
        a = dict(q=q, k=cache.k, v=cache.v, out=out, seqlens=seqlens, splits=0)
        a.update(over)
        _native.flash_attn_kvcache(
            desc(a["q"]),
            desc(a["k"]),
            desc(a["v"]),
            desc(a["out"]),
            None,
            desc(a["seqlens"]),
            None,
            None,
            None,
            0.125,
            -1,
            -1,
            0.0,
            a["splits"],
            stream(),
        )

    with pytest.raises(TypeError, match="seqlens_k"):
        call(seqlens=seqlens.float())
    with pytest.raises(ValueError, match="out overlaps q"):
        call(out=q)
    with pytest.raises(ValueError, match="num_splits"):
        call(splits=-2)
    with pytest.raises(ValueError, match="nheads_k"):
        call(
            q=randn((2, 1, 3, 64), torch.bfloat16, g),
            out=torch.empty(2, 1, 3, 64, dtype=torch.bfloat16, device="cuda"),
        )
    with pytest.raises(_native.UnsupportedError, match="float32"):
        call(q=q.float(), k=cache.k.float(), v=cache.v.float(), out=out.float())


# ---------------------------------------------------------------------------------------------
# append + rotary
# ---------------------------------------------------------------------------------------------


def run_append(
    cache: Cache,
    k_new: Any | None,
    v_new: Any | None,
    seqlens: Any,
    leftpad: Any | None = None,
    cos: Any | None = None,
    sin: Any | None = None,
    interleaved: bool = True,
    q: Any | None = None,
) -> Any | None:
    q_rot = None if q is None else torch.full_like(q, NAN)
    _native.kvcache_append(
        desc(k_new),
        desc(v_new),
        desc(cache.k),
        desc(cache.v),
        desc(seqlens),
        desc(cache.cache_batch_idx),
        desc(leftpad),
        desc(cache.block_table),
        desc(cos),
        desc(sin),
        interleaved,
        desc(q),
        desc(q_rot),
        stream(),
    )
    return q_rot


APPEND_CASES = [
    # (batch, seqlen_new, nheads, nheads_k, d, dtype, cap, page, rotary_dim, interleaved, cos fp32)
    (3, 1, 8, 2, 128, torch.bfloat16, 300, None, 128, True, False),
    (3, 5, 8, 2, 128, torch.float16, 320, 16, 64, False, True),
    (2, 13, 4, 4, 80, torch.bfloat16, 256, 64, 40, False, False),
    (4, 2, 8, 1, 256, torch.bfloat16, 512, 256, 0, True, False),
    (7, 4, 16, 4, 64, torch.float16, 200, None, 24, True, True),
]


@pytest.mark.parametrize(
    "case",
    APPEND_CASES,
    ids=lambda c: f"b{c[0]}-new{c[1]}-d{c[4]}-{NAMES[c[5]]}-page{c[7]}-rd{c[8]}-il{c[9]:d}",
)
def test_append_and_rotary(rule: Any, case: tuple) -> None:
    b, sn, h, hk, d, dtype, cap, page, rd, interleaved, cos32 = case
    g = gen()
    cache = make_cache(b, cap, hk, d, dtype, page, g, batch_idx=page is None and b > 3)
    before_k, before_v = cache.logical(cache.k).clone(), cache.logical(cache.v).clone()
    seqlens = lengths(b, cache.capacity - sn, [0, cache.capacity - sn, 1])
    leftpad = torch.tensor(
        [min(3, int(s)) for s in seqlens.tolist()], dtype=torch.int32, device="cuda"
    )
    k_new, v_new = randn((b, sn, hk, d), dtype, g), randn((b, sn, hk, d), dtype, g)
    q = randn((b, sn, h, d), dtype, g)
    cos = sin = None
    if rd:
        ang = torch.rand(cache.capacity + sn, rd // 2, generator=g, device="cuda") * 6.283
        cdt = torch.float32 if cos32 else dtype
        cos, sin = ang.cos().to(cdt), ang.sin().to(cdt)
    q_rot = run_append(cache, k_new, v_new, seqlens, leftpad, cos, sin, interleaved, q)
    after_k, after_v = cache.logical(cache.k), cache.logical(cache.v)

    pos = seqlens.long()[:, None] + torch.arange(sn, device="cuda")[None, :]  # cache slots
    rpos = pos - leftpad.long()[:, None]  # rotary positions
    written = torch.zeros(b, cache.capacity, dtype=torch.bool, device="cuda")
    written.scatter_(1, pos, True)
    # untouched slots: bit-identical; v: a copy, bit-identical
    assert torch.equal(after_k[~written], before_k[~written])
    assert torch.equal(after_v[~written], before_v[~written])
    got_v = torch.stack([after_v[i, pos[i]] for i in range(b)])
    got_k = torch.stack([after_k[i, pos[i]] for i in range(b)])
    assert torch.equal(got_v, v_new)
    if rd:
        ref_k = rotary_ref(k_new, cos, sin, rpos, interleaved, upcast=True)
        base_k = rotary_ref(k_new, cos, sin, rpos, interleaved, upcast=False)
        rule.check(got_k, ref_k, base_k, atol=1e-6, name="k after rotary")
        # columns past rotary_dim are copies
        assert torch.equal(got_k[..., rd:], k_new[..., rd:])
        ref_q = rotary_ref(q, cos, sin, rpos, interleaved, upcast=True)
        base_q = rotary_ref(q, cos, sin, rpos, interleaved, upcast=False)
        rule.check(q_rot, ref_q, base_q, atol=1e-6, name="q_rot")
    else:
        assert torch.equal(got_k, k_new)
        assert torch.equal(q_rot, q)


def test_append_past_capacity_and_bad_blocks_write_nothing() -> None:
    g = gen()
    cache = make_cache(2, 64, 2, 64, torch.bfloat16, 16, g)
    cache.block_table[1, 2] = -1  # slot 40 of batch 1 maps to a bad block
    before_k, before_v = cache.k.clone(), cache.v.clone()
    # batch 0 writes slots 62, 63 (64, 65 are past the capacity); batch 1 slots 40..43
    seqlens = torch.tensor([62, 40], dtype=torch.int32, device="cuda")
    k_new, v_new = randn((2, 4, 2, 64), torch.bfloat16, g), randn((2, 4, 2, 64), torch.bfloat16, g)
    run_append(cache, k_new, v_new, seqlens)
    torch.cuda.synchronize()
    changed = (cache.k != before_k).flatten(1).any(1) | (cache.v != before_v).flatten(1).any(1)
    blk0 = int(cache.block_table[0, 3])
    assert set(torch.nonzero(changed).flatten().tolist()) <= {blk0}
    assert torch.equal(cache.k[blk0, 14:], k_new[0, :2])


def test_decode_step_in_a_cuda_graph(rule: Any) -> None:
    """append (rotary) + split attention captured once, replayed on new inputs: stream-ordered
    scratch, no host sync, results equal the eager calls."""
    g = gen()
    b, h, hk, d = 2, 8, 2, 128
    cache = make_cache(b, 1024, hk, d, torch.bfloat16, 64, g)
    seqlens = torch.tensor([700, 3], dtype=torch.int32, device="cuda")
    seqlens_k = seqlens + 1
    ang = torch.rand(1100, d // 2, generator=g, device="cuda")
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    q = randn((b, 1, h, d), torch.bfloat16, g)
    k_new, v_new = randn((b, 1, hk, d), torch.bfloat16, g), randn((b, 1, hk, d), torch.bfloat16, g)
    q_rot = torch.empty_like(q)
    out = torch.empty_like(q)
    lse = torch.empty(b, h, 1, dtype=torch.float32, device="cuda")

    def step() -> None:
        _native.kvcache_append(
            desc(k_new),
            desc(v_new),
            desc(cache.k),
            desc(cache.v),
            desc(seqlens),
            None,
            None,
            desc(cache.block_table),
            desc(cos),
            desc(sin),
            False,
            desc(q),
            desc(q_rot),
            stream(),
        )
        _native.flash_attn_kvcache(
            desc(q_rot),
            desc(cache.k),
            desc(cache.v),
            desc(out),
            desc(lse),
            desc(seqlens_k),
            None,
            None,
            desc(cache.block_table),
            1.0 / math.sqrt(d),
            -1,
            0,
            0.0,
            4,
            stream(),
        )

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compiles / loads the kernels outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        q.copy_(randn(q.shape, torch.bfloat16, g))
        k_new.copy_(randn(k_new.shape, torch.bfloat16, g))
        v_new.copy_(randn(v_new.shape, torch.bfloat16, g))
        out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        got = out.clone()
        out.fill_(NAN)
        step()
        assert torch.equal(got, out)
        k, v = cache.logical(cache.k), cache.logical(cache.v)
        ref_o, _ = attention_ref(
            q_rot, k, v, seqlens_k, None, 1.0 / math.sqrt(d), (-1, 0), 0.0, True
        )
        base_o, _ = attention_ref(
            q_rot, k, v, seqlens_k, None, 1.0 / math.sqrt(d), (-1, 0), 0.0, False
        )
        rule.check(got, ref_o, base_o, atol=1e-5, name="graph out")


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("seqlens_kind", ["tensor", "int"])
@pytest.mark.parametrize("rotary", [False, True])
def test_public_api_decode_step_matches_the_reference(
    paged: bool, seqlens_kind: str, rotary: bool
) -> None:
    """`flashscan.flash_attn_with_kvcache` end to end on the GPU (append + rotary + attention,
    out= given and not), twice in a row (the arrays the call makes for the kernels must stay
    alive until they are launched), against the NumPy reference on host copies."""
    import flashscan
    from flashscan import reference_kvcache

    g = gen()
    b, sq, h, hk, d, cap, sn = 3, 2, 8, 2, 64, 320, 2
    dt = torch.bfloat16
    q = randn((b, sq, h, d), dt, g)
    if paged:
        page = 64
        nblk = cap // page
        kc = randn((b * nblk, page, hk, d), dt, g)
        table = torch.randperm(b * nblk, device="cuda").view(b, nblk).to(torch.int32)
    else:
        kc = randn((b, cap, hk, d), dt, g)
        table = None
    vc = randn(tuple(kc.shape), dt, g)
    kn, vn = randn((b, sn, hk, d), dt, g), randn((b, sn, hk, d), dt, g)
    lens_list = [5, 200, 0] if seqlens_kind == "tensor" else [150] * b
    lens: Any = torch.tensor(lens_list, dtype=torch.int32, device="cuda")
    if seqlens_kind == "int":
        lens = lens_list[0]
    cos = sin = None
    if rotary:
        ang = randn((cap, d // 4), torch.float32, g)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    for out in (None, torch.full_like(q, NAN)):
        kc_h, vc_h = kc.float().cpu().numpy(), vc.float().cpu().numpy()
        res = flashscan.flash_attn_with_kvcache(
            q,
            kc,
            vc,
            k=kn,
            v=vn,
            rotary_cos=cos,
            rotary_sin=sin,
            cache_seqlens=lens,
            block_table=table,
            causal=True,
            return_lse=True,
            out=out,
        )
        got, lse = res
        torch.cuda.synchronize()
        ref, ref_lse = reference_kvcache.flash_attn_with_kvcache(
            q.float().cpu().numpy(),
            kc_h,
            vc_h,
            k=kn.float().cpu().numpy(),
            v=vn.float().cpu().numpy(),
            rotary_cos=None if cos is None else cos.float().cpu().numpy(),
            rotary_sin=None if sin is None else sin.float().cpu().numpy(),
            cache_seqlens=lens if isinstance(lens, int) else lens.cpu().numpy(),
            block_table=None if table is None else table.cpu().numpy(),
            causal=True,
            return_lse=True,
        )
        assert torch.isfinite(got).all()
        err = (got.float().cpu() - torch.from_numpy(ref).float()).abs().max().item()
        assert err < 3e-2, f"out differs from the reference by {err}"
        fin = torch.isfinite(torch.from_numpy(ref_lse))
        lse_err = (lse.cpu()[fin] - torch.from_numpy(ref_lse).float()[fin]).abs().max().item()
        assert lse_err < 2e-2
        # the caches the GPU appended into equal the reference's (a copy, or rotary in bf16)
        kc_got = kc.float().cpu().numpy()
        assert (abs(kc_got - kc_h) <= 1e-2 * abs(kc_h) + 1e-3).all()
        assert (vc.float().cpu().numpy() == vc_h).all()
        if out is not None:
            assert got.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_hot_path_decode_loop_matches_the_reference(paged: bool, rotary: bool) -> None:
    """A decode loop through the public API: the first call of the signature takes the general
    path and records a plan, the next ones take the hot path (cache_seqlens advanced in place,
    lse asked for on every other step). Every step equals the reference on host copies of the
    caches as they were before it; bad options still raise on the hot path; a step captured in
    a CUDA graph replays right."""
    import flashscan
    from flashscan import kvcache, reference_kvcache

    g = gen()
    b, h, hk, d, cap, page = 2, 8, 2, 128, 256, 64
    dt = torch.bfloat16
    if paged:
        kc = randn((b * cap // page, page, hk, d), dt, g)
        table = torch.randperm(b * cap // page, device="cuda").view(b, -1).to(torch.int32)
    else:
        kc, table = randn((b, cap, hk, d), dt, g), None
    vc = randn(tuple(kc.shape), dt, g)
    lens = torch.tensor([3, 130], dtype=torch.int32, device="cuda")
    cos = sin = None
    if rotary:
        ang = randn((cap, d // 2), torch.float32, g)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)

    def host(t: Any) -> Any:
        return None if t is None else t.float().cpu().numpy()

    def step(q: Any, kn: Any, vn: Any, want_lse: bool, **kw: Any) -> Any:
        return flashscan.flash_attn_with_kvcache(
            q, kc, vc, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
            block_table=table, causal=True, return_lse=want_lse, **kw,
        )  # fmt: skip

    def reference(q: Any, kn: Any, vn: Any, kc_h: Any, vc_h: Any, lens_h: Any) -> Any:
        return reference_kvcache.flash_attn_with_kvcache(
            host(q), kc_h, vc_h, k=host(kn), v=host(vn), rotary_cos=host(cos),
            rotary_sin=host(sin), cache_seqlens=lens_h, block_table=host(table), causal=True,
            return_lse=True,
        )  # fmt: skip

    kvcache._PLANS.clear()
    kvcache._LAST = (None, None)
    for i in range(5):
        q, kn, vn = (randn((b, 1, x, d), dt, g) for x in (h, hk, hk))
        kc_h, vc_h, lens_h = host(kc), host(vc), lens.cpu().numpy()
        res = step(q, kn, vn, i % 2 == 1)
        got, lse = res if i % 2 == 1 else (res, None)
        torch.cuda.synchronize()
        ref, ref_lse = reference(q, kn, vn, kc_h, vc_h, lens_h)
        err = (got.float().cpu() - torch.from_numpy(ref).float()).abs().max().item()
        assert err < 3e-2, f"step {i}: out differs from the reference by {err}"
        if lse is not None:
            lse_err = (lse.cpu() - torch.from_numpy(ref_lse).float()).abs().max().item()
            assert lse_err < 2e-2, f"step {i}: lse differs by {lse_err}"
        # one signature, one plan (recorded by step 0, or step 1 when step 0 was the process's
        # first torch call: the torch types are registered then): the later steps took it
        assert len(kvcache._PLANS) == 1 or i == 0
        lens += 1

    q, kn, vn = (randn((b, 1, x, d), dt, g) for x in (h, hk, hk))
    with pytest.raises(ValueError, match="softcap"):
        step(q, kn, vn, False, softcap=-1.0)
    with pytest.raises(ValueError, match="num_splits"):
        step(q, kn, vn, False, num_splits=-2)

    # one step captured in a graph (the hot path allocates out through torch's allocator)
    kc_h, vc_h, lens_h = host(kc), host(vc), lens.cpu().numpy()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        got = step(q, kn, vn, False)
    torch.cuda.current_stream().wait_stream(s)
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = reference(q, kn, vn, kc_h, vc_h, lens_h)
    err = (got.float().cpu() - torch.from_numpy(ref).float()).abs().max().item()
    assert err < 3e-2, f"graph replay: out differs from the reference by {err}"


def test_hot_path_without_cache_seqlens_matches_the_reference() -> None:
    """transformers' decode step: no cache_seqlens, no append, k/v the (batch, heads, seq, hd)
    cache seen through a transpose. The first call of a signature records a plan, the next take
    the hot path (zeros + capacity as the key counts); each equals the float64 reference over
    every slot, NaN-poisoned out; a batch size first seen inside a graph capture replays right
    and a later eager call of that batch size still reads true zeros."""
    import flashscan
    from flashscan import kvcache

    g = gen()
    h, hk, d = 8, 2, 64
    dt = torch.bfloat16
    kvcache._PLANS.clear()
    kvcache._LAST = (None, None)
    kvcache._ZEROS.clear()

    def case(b: int, s: int) -> tuple[Any, Any, Any]:
        q = randn((b, h, 1, d), dt, g).transpose(1, 2)
        kt, vt = randn((b, hk, s, d), dt, g), randn((b, hk, s, d), dt, g)
        return q, kt.transpose(1, 2), vt.transpose(1, 2)

    def reference(q: Any, k: Any, v: Any) -> Any:
        rep = h // hk
        qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
        kd, vd = kd.repeat_interleave(rep, 1), vd.repeat_interleave(rep, 1)
        p = torch.softmax(qd @ kd.transpose(-1, -2) / math.sqrt(d), dim=-1)
        return (p @ vd).transpose(1, 2)

    def check(got: Any, q: Any, k: Any, v: Any, what: str) -> None:
        ref = reference(q, k, v)
        base = (reference(q.float(), k.float(), v.float()).to(dt).double() - ref).abs().max()
        err = (got.double() - ref).abs().max().item()
        assert torch.isfinite(got).all(), f"{what}: unwritten (NaN) elements"
        assert err <= 2 * base.item() + 2e-3, f"{what}: err {err} vs bf16 baseline {base}"

    for s in (1, 63, 600, 600, 600, 1001):
        q, k, v = case(3, s)
        out = torch.full_like(q, NAN)
        got = flashscan.flash_attn_with_kvcache(q, k, v, out=out, causal=True)
        torch.cuda.synchronize()
        check(got, q, k, v, f"s{s}")
    assert kvcache._LAST[0] is not None and kvcache._LAST[0][7] is None  # the hot path's key

    # batch 5 first seen inside a capture: its zeros are a node of the graph, not cached
    q, k, v = case(5, 300)
    flashscan.flash_attn_with_kvcache(q, k, v, causal=True)  # records the plan (general path)
    kvcache._ZEROS.clear()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(st), torch.cuda.graph(graph):
        got = flashscan.flash_attn_with_kvcache(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(st)
    assert not kvcache._ZEROS
    graph.replay()
    torch.cuda.synchronize()
    check(got, q, k, v, "graph replay")
    eager = flashscan.flash_attn_with_kvcache(q, k, v, causal=True)
    torch.cuda.synchronize()
    check(eager, q, k, v, "eager after the capture")
