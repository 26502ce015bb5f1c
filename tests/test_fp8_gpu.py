"""GPU tests of the FP8 attention forward (`flash_attn_func` on float8_e4m3fn q / k / v with
flash-attn 3's descales; the FP8 build of cuda/flash_fwd_sm90_tma.cu on sm_90, V transposed by
its producer warps (or, FLASHSCAN_SM90_FP8_VT=prepass, by cuda/flash_fp8_vt.cu), the dequantised
16-bit path elsewhere).

Correctness rule of DESIGN.md: the reference is float64 attention over the dequantised inputs
(value x descale, exact); the same-precision baseline is what an FP8 kernel computes at best, in
float32 over the same inputs: S = Q K^T kept to 11 significant bits (Hopper's FP8 tensor cores
accumulate with ~14), P = exp(S - rowmax) rounded to e4m3, O = (P V) / rowsum(P) rounded to
bfloat16. Outputs poisoned with NaN (out=), LSE against float64, tails (seqlen not a multiple of
128, seqlen 1), seqlen_q != seqlen_k, GQA / MQA, causal and windows, head dims 16-128 (the 128
tile, padded), permuted (b, h, s, d) storage, descales per (batch, kv head), broadcast or absent.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

# b, sq, sk, h, hk, d, causal, window, bhsd, descale form
CASES = [
    (2, 256, 256, 4, 4, 128, False, (-1, -1), False, "per-head"),
    (2, 333, 333, 4, 2, 128, True, (-1, -1), False, "per-head"),
    (1, 1000, 1000, 4, 1, 128, True, (-1, -1), False, "scalar"),
    (2, 200, 517, 4, 4, 128, True, (-1, -1), False, "none"),
    (2, 517, 200, 4, 1, 128, True, (-1, -1), False, "per-head"),
    (1, 700, 700, 2, 2, 96, False, (100, 30), False, "per-head"),
    (3, 17, 300, 2, 2, 128, False, (-1, -1), True, "per-head"),
    (2, 1, 129, 4, 4, 128, True, (-1, -1), False, "per-head"),
    (2, 129, 1, 2, 2, 32, False, (-1, -1), False, "none"),
    (2, 300, 650, 2, 2, 64, False, (64, 0), False, "per-head"),
    (2, 77, 95, 2, 1, 16, True, (-1, -1), True, "scalar"),
    (4, 1100, 1100, 16, 4, 128, False, (-1, -1), False, "per-head"),
    (3, 900, 1500, 8, 8, 112, False, (256, 64), False, "per-head"),
]


def quantize(x: Any, hk: int) -> tuple[Any, Any]:
    """x (b, s, h, d) float32 -> (e4m3 x / descale, descale (b, hk)), one scale a (batch, kv
    head) group, the group's max at 448 / 2 (flash-attn 3's per-(batch, kv head) descales)."""
    b, s, h, d = x.shape
    g = x.reshape(b, s, hk, h // hk, d).abs().amax(dim=(1, 3, 4)).clamp_min(1e-6)  # (b, hk)
    ds = g / 224.0
    per_head = ds.repeat_interleave(h // hk, dim=1)[:, None, :, None]
    return (x / per_head).to(torch.float8_e4m3fn), ds


def dequant(x8: Any, ds: Any | None, hk: int) -> Any:
    b, h = x8.shape[0], x8.shape[2]
    x = x8.to(torch.float64)
    if ds is not None:
        ds = ds.to(torch.float64).reshape((1,) * (2 - ds.dim()) + tuple(ds.shape)).expand(b, hk)
        x = x * ds.repeat_interleave(h // hk, dim=1)[:, None, :, None]
    return x


def keep_bits(x: Any, bits: int) -> Any:
    """x rounded to `bits` significant bits (float32 range)."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.round(m * 2.0**bits) / 2.0**bits, e)


def visible(sq: int, sk: int, causal: bool, window: tuple[int, int], device: Any) -> Any:
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        vis &= j <= i + right
    if left >= 0:
        vis &= j >= i - left
    return vis


def attention_ref(q: Any, k: Any, v: Any, causal: bool, window: tuple[int, int], fp8: bool):
    """(out, lse): float64 (fp8=False), or the FP8 baseline (float32, P rounded to e4m3 before
    P V, out rounded to bfloat16). q, k, v dequantised, (b, s, h, d)."""
    dt = torch.float32 if fp8 else torch.float64
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    if fp8:
        # Hopper's FP8 tensor cores keep ~14 bits of the accumulation (DeepSeek-V3, 3.3.2), over
        # the k32 steps: the baseline's scores keep 11
        s = keep_bits(s, 11)
    s = s / math.sqrt(d)
    s = s.masked_fill(~visible(sq, sk, causal, window, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    mx = s.amax(dim=-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    p = torch.exp(s - mx)
    den = p.sum(dim=-1, keepdim=True)
    if fp8:
        p = p.to(torch.float8_e4m3fn).to(dt)
    o = torch.einsum("bhqk,bkhd->bhqd", p, v) / torch.where(den > 0, den, torch.ones_like(den))
    o = o.transpose(1, 2)
    if fp8:
        o = o.to(torch.bfloat16)
    return o, lse


def make(case: tuple, seed: int):
    b, sq, sk, h, hk, d, causal, window, bhsd, form = case
    torch.manual_seed(seed)
    shapes = [(sq, h), (sk, hk), (sk, hk)]
    xs = [torch.randn(b, s, n, d, device="cuda") * 2.0 for s, n in shapes]
    q8, qd = quantize(xs[0], hk)
    k8, kd = quantize(xs[1], hk)
    v8, vd = quantize(xs[2], hk)
    if bhsd:  # (b, h, s, d) storage seen as (b, s, h, d)
        q8, k8, v8 = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q8, k8, v8))
    if form == "none":
        qd = kd = vd = None  # (the quantised values read without their scales: valid inputs)
    elif form == "scalar":
        # one number for all (batch, kv head) pairs (the values were quantised per pair: read
        # with another scale, still valid inputs)
        qd, kd, vd = (x.amax().reshape(1) for x in (qd, kd, vd))
    return q8, k8, v8, qd, kd, vd


@pytest.fixture(scope="module")
def flashscan_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import flashscan

    if not flashscan.available():
        pytest.skip("flashscan's GPU backend is not available")
    return flashscan


def _case_id(c: tuple) -> str:
    return f"b{c[0]}-q{c[1]}-k{c[2]}-h{c[3]}/{c[4]}-d{c[5]}-{'causal' if c[6] else 'full'}-{c[9]}"


@pytest.mark.parametrize("persist", ["default", "0", "queue", "prepass"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fp8_forward_matches_float64_within_the_fp8_baseline(
    flashscan_gpu, case, persist, monkeypatch
):
    """Every case on the default forms (unmasked: persistent with a static stride; masked: the
    tile queue), on one CTA a tile, and on the queue for all (FLASHSCAN_SM90_PERSIST, read on
    every call); and on the pre-pass's Vt (FLASHSCAN_SM90_FP8_VT=prepass: the default where
    each V row serves many query rows, attention_fp8::PREPASS_MIN_REUSE) in the default forms."""
    if persist == "prepass":
        monkeypatch.setenv("FLASHSCAN_SM90_FP8_VT", "prepass")
    elif persist != "default":
        monkeypatch.setenv("FLASHSCAN_SM90_PERSIST", persist)
    # (head dims 16-64 take the 16-bit path by default: run them on the FP8 kernel here)
    monkeypatch.setenv("FLASHSCAN_FP8_SMALL_HEAD_DIMS", "1")
    from conftest import check_rule

    b, sq, sk, h, hk, d, causal, window, bhsd, form = case
    q8, k8, v8, qd, kd, vd = make(case, seed=sq * 31 + sk * 7 + d + h)
    out = torch.full((b, sq, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    o, lse = flashscan_gpu.flash_attn_func(
        q8,
        k8,
        v8,
        causal=causal,
        window_size=window,
        return_lse=True,
        out=out,
        q_descale=qd,
        k_descale=kd,
        v_descale=vd,
    )
    torch.cuda.synchronize()
    assert o is out and o.dtype == torch.bfloat16
    qf, kf, vf = dequant(q8, qd, hk), dequant(k8, kd, hk), dequant(v8, vd, hk)
    ref, ref_lse = attention_ref(qf, kf, vf, causal, window, fp8=False)
    base, base_lse = attention_ref(qf, kf, vf, causal, window, fp8=True)
    check_rule(o, ref, base, atol=1e-3, name="out")
    check_rule(lse, ref_lse, base_lse, atol=1e-3, name="lse")


def test_fp8_runs_the_e4m3_kernel_on_hopper(flashscan_gpu):
    """On sm_90 the FP8 call must not be the dequantised path: its result differs from the
    16-bit kernel's on the dequantised inputs (P rounded to e4m3), and it is deterministic."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the e4m3 kernel is sm_90 only")
    case = (2, 512, 512, 4, 4, 128, False, (-1, -1), False, "per-head")
    q8, k8, v8, qd, kd, vd = make(case, seed=5)
    kw = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    o1 = flashscan_gpu.flash_attn_func(q8, k8, v8, **kw)
    o2 = flashscan_gpu.flash_attn_func(q8, k8, v8, **kw)
    o16 = flashscan_gpu.flash_attn_func(
        *(dequant(x, s, 4).to(torch.bfloat16) for x, s in ((q8, qd), (k8, kd), (v8, vd)))
    )
    torch.cuda.synchronize()
    assert torch.equal(o1, o2)
    assert not torch.equal(o1, o16)


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_in_kernel_transpose_equals_the_prepass_bit_for_bit(flashscan_gpu, causal, monkeypatch):
    """The producer warps' V transpose must give the Vt the pre-pass writes: the same kernel
    arithmetic on the same Vt, so identical outputs (one CTA a tile both; a tail, GQA, a head
    dim below the tile, a strided V)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the e4m3 kernel is sm_90 only")
    monkeypatch.setenv("FLASHSCAN_SM90_PERSIST", "0")
    case = (2, 333, 700, 6, 2, 96, causal, (-1, -1), True, "per-head")
    q8, k8, v8, qd, kd, vd = make(case, seed=11)
    kw = {"causal": causal, "q_descale": qd, "k_descale": kd, "v_descale": vd}
    monkeypatch.setenv("FLASHSCAN_SM90_FP8_VT", "kernel")
    o1 = flashscan_gpu.flash_attn_func(q8, k8, v8, **kw)
    monkeypatch.setenv("FLASHSCAN_SM90_FP8_VT", "prepass")
    o2 = flashscan_gpu.flash_attn_func(q8, k8, v8, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(o1.float()).all()
    assert torch.equal(o1, o2)


def test_fp8_small_head_dims_take_the_16bit_path_by_default(flashscan_gpu):
    """Head dim 64 in e4m3: the dequantised bf16 path unless FLASHSCAN_FP8_SMALL_HEAD_DIMS=1 (then
    the FP8 kernel, whose P rounding makes the results differ)."""
    case = (2, 300, 300, 4, 2, 64, False, (-1, -1), False, "per-head")
    q8, k8, v8, qd, kd, vd = make(case, seed=3)
    kw = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    o = flashscan_gpu.flash_attn_func(q8, k8, v8, **kw)

    def deq32(x: Any, s: Any) -> Any:  # (the fallback's own dequantisation, in float32)
        per = s.repeat_interleave(x.shape[2] // 2, dim=1)[:, None, :, None]
        return (x.to(torch.float32) * per).to(torch.bfloat16)

    o16 = flashscan_gpu.flash_attn_func(deq32(q8, qd), deq32(k8, kd), deq32(v8, vd))
    torch.cuda.synchronize()
    assert torch.equal(o, o16)


@pytest.mark.parametrize("d", [256, 72])
def test_fp8_head_dims_off_the_tile_take_the_dequantised_path(flashscan_gpu, d):
    from conftest import check_rule

    case = (2, 200, 300, 4, 2, d, True, (-1, -1), False, "per-head")
    q8, k8, v8, qd, kd, vd = make(case, seed=d)
    o = flashscan_gpu.flash_attn_func(
        q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd
    )
    torch.cuda.synchronize()
    assert o.dtype == torch.bfloat16
    qf, kf, vf = dequant(q8, qd, 2), dequant(k8, kd, 2), dequant(v8, vd, 2)
    ref, _ = attention_ref(qf, kf, vf, True, (-1, -1), fp8=False)
    from test_attention_gpu import attention_torch

    base, _ = attention_torch(
        qf.to(torch.bfloat16),
        kf.to(torch.bfloat16),
        vf.to(torch.bfloat16),
        causal=True,
        upcast=False,
    )
    check_rule(o, ref, base, atol=1e-3, name="out")
