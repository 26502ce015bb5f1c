"""GPU tests of `flash_attn_func` (torch on CUDA; cupy and jax where installed).

The correctness rule of DESIGN.md over a sampled matrix of issue 3: batch 1-4, seqlens
{1, 7, 63, 64, 65, 128, 1000, 4097} for q and k independently, every head-dim tile (and odd
multiples of 8 that are padded), nheads_k in {nheads, nheads/4, 1}, causal, windows, softcap,
fp16/bf16/fp32, LSE. Reference: torch math attention in float64; baseline: the same math in the
inputs' precision (fp32: with TF32 matmuls, the precision flashscan's fp32 path may use).
Also: poisoned outputs, out= zero-copy, cupy/jax round trips, a non-default stream, CUDA graphs.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

import flashscan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SEQLENS = [1, 7, 63, 64, 65, 128, 1000, 4097]
TILE_HEADDIMS = [32, 64, 96, 128, 192, 256]
PADDED_HEADDIMS = [8, 40, 136, 248]
# (causal, window_size, softcap)
MASKS = {
    "none": (False, (-1, -1), 0.0),
    "causal": (True, (-1, -1), 0.0),
    "window": (False, (48, 16), 0.0),
    "causal-window": (True, (100, -1), 0.0),
    "softcap": (False, (-1, -1), 30.0),
    "causal-softcap": (True, (-1, -1), 5.0),
}
# fp32 baseline uses TF32 matmuls: set to False if flashscan's fp32 path is full fp32.
FP32_BASELINE_TF32 = True


# ---------------------------------------------------------------------------------------------
# torch math attention: the float64 reference and the same-precision baseline
# ---------------------------------------------------------------------------------------------


def attention_torch(
    q: Any,
    k: Any,
    v: Any,
    scale: float | None = None,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    upcast: bool = True,
) -> tuple[Any, Any]:
    """(out, lse) of plain attention. upcast=True: in float64 (the reference); False: in the
    inputs' dtype (the baseline: scores and P rounded to that dtype, softmax in float32).
    A query that sees no key gets out 0 and lse -inf (as flashscan's reference)."""
    dt = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = (
        (not upcast) and dt == torch.float32 and FP32_BASELINE_TF32
    )
    try:
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        left, right = window
        if causal:
            right = 0
        i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=q.device)[None, :]
        vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        if right >= 0:
            vis &= j <= i + right
        if left >= 0:
            vis &= j >= i - left
        s = s.masked_fill(~vis, float("-inf"))
        lse = torch.logsumexp(s.float() if not upcast else s, dim=-1)
        p = torch.softmax(s.float() if not upcast else s, dim=-1)
        p = torch.nan_to_num(p, nan=0.0).to(dt)  # rows that see no key
        out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out, lse


def make_qkv(
    b: int, sq: int, sk: int, h: int, hk: int, d: int, dtype: Any, device: str = "cuda"
) -> tuple[Any, Any, Any]:
    g = torch.Generator(device=device)
    g.manual_seed(random.getrandbits(62))
    mk = lambda s: torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dtype)  # noqa: E731
    return mk((b, sq, h, d)), mk((b, sk, hk, d)), mk((b, sk, hk, d))


def check_attention(
    rule: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any | None,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    scale: float | None = None,
) -> None:
    ref_o, ref_l = attention_torch(q, k, v, scale, causal, window, softcap, upcast=True)
    base_o, base_l = attention_torch(q, k, v, scale, causal, window, softcap, upcast=False)
    slack = 1e-5 * max(1.0, float(ref_o.abs().max()))
    rule.check(out, ref_o, base_o, atol=slack, name=f"out ({q.dtype})")
    if lse is not None:
        rule.check(lse, ref_l, base_l, atol=1e-4, name="lse")


# ---------------------------------------------------------------------------------------------
# The sampled matrix
# ---------------------------------------------------------------------------------------------


def _cases() -> list[tuple]:
    r = random.Random(1234)
    cases = []
    # every head-dim tile (and padded ones) x every dtype, at odd small sizes
    i = 0
    for d in TILE_HEADDIMS + PADDED_HEADDIMS:
        for dt in DTYPES:
            mask = list(MASKS)[i % len(MASKS)]
            sq, sk = (65, 128) if i % 2 else (63, 65)
            h = 8
            hk = (h, h // 4, 1)[i % 3]
            cases.append(("tile", 2, sq, sk, h, hk, d, dt, mask, i % 2 == 0, i % 4 < 2))
            i += 1
    # every (seqlen_q, seqlen_k) pair, other parameters drawn
    for sq in SEQLENS:
        for sk in SEQLENS:
            big = sq * sk > 500_000
            b = 1 if big else r.randint(1, 4)
            h = 4 if big else 8
            hk = r.choice((h, h // 4, 1))
            d = r.choice(TILE_HEADDIMS + PADDED_HEADDIMS[:2])
            dt = r.choice(list(DTYPES))
            mask = r.choice(list(MASKS))
            cases.append(("seq", b, sq, sk, h, hk, d, dt, mask, r.random() < 0.5, r.random() < 0.5))
    return cases


CASES = _cases()


def _id(c: tuple) -> str:
    kind, b, sq, sk, h, hk, d, dt, mask, lse, give_out = c
    tail = ("-lse" if lse else "") + ("-out" if give_out else "")
    return f"{kind}-b{b}-q{sq}-k{sk}-h{h}/{hk}-d{d}-{dt}-{mask}{tail}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_attention_matrix(case: tuple, rule: Any, poison: Any) -> None:
    _, b, sq, sk, h, hk, d, dt, mask, return_lse, give_out = case
    causal, window, softcap = MASKS[mask]
    q, k, v = make_qkv(b, sq, sk, h, hk, d, DTYPES[dt])
    out = None
    if give_out:
        out = torch.full_like(q, float("nan"))
    else:
        poison(q.numel() * q.element_size(), b * h * sq * 4)
    res = flashscan.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=return_lse, out=out
    )
    o, lse = res if return_lse else (res, None)
    assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    if out is not None:
        assert o is out
    if lse is not None:
        assert lse.shape == (b, h, sq) and lse.dtype == torch.float32 and lse.device == q.device
    torch.cuda.synchronize()
    check_attention(rule, q, k, v, o, lse, causal, window, softcap)


def test_softmax_scale_and_strided_views(rule: Any) -> None:
    """q/k/v as views into a packed (b, s, 3, h, d) tensor: only the last dim is contiguous."""
    qkv = torch.randn(2, 77, 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    out, lse = flashscan.flash_attn_func(q, k, v, softmax_scale=0.07, causal=True, return_lse=True)
    check_attention(rule, q, k, v, out, lse, True, (-1, -1), 0.0, scale=0.07)


def test_reference_helper_matches_numpy_reference() -> None:
    """Self-check of this file's torch reference against flashscan.reference."""
    q, k, v = make_qkv(2, 9, 13, 4, 2, 16, torch.float32)
    for causal, window, cap in MASKS.values():
        o, lse = attention_torch(q, k, v, None, causal, window, cap)
        ro, rl = flashscan.reference.flash_attn_func(
            *(t.cpu().numpy() for t in (q, k, v)),
            causal=causal,
            window_size=window,
            softcap=cap,
            return_lse=True,
            accum_dtype=np.float64,
        )
        np.testing.assert_allclose(o.cpu().numpy(), ro, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse.cpu().numpy(), rl, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Zero-copy, frameworks, streams, graphs
# ---------------------------------------------------------------------------------------------


def test_out_is_zero_copy(rule: Any) -> None:
    q, k, v = make_qkv(2, 100, 100, 8, 2, 128, torch.float16)
    out = torch.full_like(q, float("nan"))
    ptr = out.data_ptr()
    res = flashscan.flash_attn_func(q, k, v, out=out)
    assert res is out and res.data_ptr() == ptr
    torch.cuda.synchronize()
    check_attention(rule, q, k, v, out, None, False, (-1, -1), 0.0)


def test_inputs_untouched() -> None:
    q, k, v = make_qkv(1, 65, 65, 4, 4, 64, torch.bfloat16)
    before = [t.clone() for t in (q, k, v)]
    flashscan.flash_attn_func(q, k, v, causal=True, softcap=3.0, return_lse=True)
    torch.cuda.synchronize()
    for t, b0 in zip((q, k, v), before):
        assert torch.equal(t, b0)


def test_cupy_round_trip(rule: Any) -> None:
    cupy = pytest.importorskip("cupy")
    q, k, v = make_qkv(2, 63, 65, 4, 1, 64, torch.float16)
    cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
    out, lse = flashscan.flash_attn_func(cq, ck, cv, causal=True, return_lse=True)
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert out.device.id == q.device.index and out.dtype == cupy.float16 and out.shape == q.shape
    cupy.cuda.get_current_stream().synchronize()
    check_attention(
        rule, q, k, v, torch.from_dlpack(out), torch.from_dlpack(lse), True, (-1, -1), 0.0
    )
    # out= given as a cupy array
    o = cupy.full(q.shape, cupy.nan, dtype=cupy.float16)
    assert flashscan.flash_attn_func(cq, ck, cv, out=o) is o
    cupy.cuda.get_current_stream().synchronize()
    assert not bool(cupy.isnan(o).any())


def test_cupy_nondefault_stream(rule: Any) -> None:
    cupy = pytest.importorskip("cupy")
    q, k, v = make_qkv(1, 128, 128, 4, 4, 64, torch.float16)
    cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
    torch.cuda.synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        out = flashscan.flash_attn_func(cq, ck, cv)
    s.synchronize()
    check_attention(rule, q, k, v, torch.from_dlpack(out), None, False, (-1, -1), 0.0)


def test_jax_round_trip(rule: Any) -> None:
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("jax has no GPU backend here")
    import jax.dlpack

    q, k, v = make_qkv(2, 33, 47, 4, 2, 64, torch.bfloat16)
    torch.cuda.synchronize()
    jq, jk, jv = (jax.dlpack.from_dlpack(t.contiguous()) for t in (q, k, v))
    out, lse = flashscan.flash_attn_func(jq, jk, jv, causal=True, return_lse=True)
    assert isinstance(out, jax.Array) and out.shape == q.shape and str(out.dtype) == "bfloat16"
    t_out = torch.from_dlpack(out)
    t_lse = torch.from_dlpack(lse)
    check_attention(rule, q, k, v, t_out, t_lse, True, (-1, -1), 0.0)


def test_nondefault_torch_stream_ordering(rule: Any) -> None:
    """Work queued on a side stream before the call (a long sleep, then the copy that fills q)
    must be ordered before flashscan's kernel, and the call must not block the host."""
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep missing")
    q, k, v = make_qkv(2, 200, 200, 8, 2, 64, torch.bfloat16)
    flashscan.flash_attn_func(q, k, v)  # warm-up: compile and load outside the timed part
    qn = torch.full_like(q, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on `side`
        qn.copy_(q)
        out = flashscan.flash_attn_func(qn, k, v)
        still_running = not side.query()
        res = out.clone()
    side.synchronize()
    assert still_running, "flash_attn_func synchronised the host with the stream"
    check_attention(rule, q, k, v, res, None, False, (-1, -1), 0.0)


def test_cuda_graph_capture_and_replay(rule: Any) -> None:
    q, k, v = make_qkv(2, 60, 60, 8, 8, 64, torch.bfloat16)
    out = torch.empty_like(q)
    lse_holder: list[Any] = []
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles, loads the module) outside the capture
        flashscan.flash_attn_func(q, k, v, causal=True, out=out, return_lse=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _, lse = flashscan.flash_attn_func(q, k, v, causal=True, out=out, return_lse=True)
        lse_holder.append(lse)
    for _ in range(2):
        nq, nk, nv = make_qkv(2, 60, 60, 8, 8, 64, torch.bfloat16)
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        out.fill_(float("nan"))
        lse_holder[0].fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_attention(rule, nq, nk, nv, out, lse_holder[0], True, (-1, -1), 0.0)


def test_errors_on_gpu() -> None:
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64, torch.float16)
    with pytest.raises(ValueError, match="mixing CPU and GPU"):
        flashscan.flash_attn_func(q, k.cpu(), v)
    with pytest.raises(flashscan.UnsupportedError, match="headdim 320"):
        z = torch.zeros(1, 4, 1, 320, device="cuda", dtype=torch.float16)
        flashscan.flash_attn_func(z, z, z)
    with pytest.raises(TypeError, match="out"):
        flashscan.flash_attn_func(q, k, v, out=torch.empty_like(q, dtype=torch.float32))
    with pytest.raises(ValueError, match="contiguous"):
        flashscan.flash_attn_func(q.transpose(1, 3).contiguous().transpose(1, 3), k, v)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="same device"):
            flashscan.flash_attn_func(q, k.to("cuda:1"), v)
