"""GPU tests of the backward kernels through `flashscan.torch` (issue 6).

Attention: dq, dk, dv against torch float64 autograd of math attention, by the correctness rule
(baseline: autograd of the same math attention in the inputs' dtype); float32 to 1e-4
relative. Matrix: head dims 32..256 incl. padded ones, odd seqlens with seqlen_q != seqlen_k
both ways, causal, sliding windows, softcap, GQA and MQA, fp16/bf16/fp32; deterministic mode
bit-reproducible; poisoned gradient buffers; a non-default stream; CUDA graph capture of a
forward + backward step.

Selective scan: every gradient against torch float64 autograd of the float64 reference scan of
test_scan_gpu (baseline for 16-bit results: the float64 gradient rounded to that dtype;
float32 results relative to their largest reference value: elementwise ones 1e-4, sums over
batch and time or channels (dA, dB, dC, dD, ddelta_bias) 1e-3). Matrix: fixed / varying / grouped
B and C, D, z, delta_bias, softplus, initial and last state, dstate 1..256, seqlens 1..100000.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

import flashscan

torch = pytest.importorskip("torch")

from test_attention_gpu import attention_torch, make_qkv  # noqa: E402
from test_scan_gpu import _size, scan_inputs, scan_ref  # noqa: E402

import flashscan.torch as fst  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def _attn_cases() -> list[tuple]:
    r = random.Random(606)
    cases = []
    seqs = [(1, 1), (7, 7), (63, 65), (65, 63), (128, 128), (1, 300), (300, 40), (1000, 1000)]
    hds = [32, 64, 96, 128, 256, 40, 72, 8]
    masks = [
        (False, (-1, -1), 0.0),
        (True, (-1, -1), 0.0),
        (False, (32, 8), 0.0),
        (True, (-1, -1), 20.0),
        (False, (-1, -1), 5.0),
        (True, (48, -1), 0.0),
    ]
    heads = [(4, 4), (4, 1), (8, 2)]
    for i, (sq, sk) in enumerate(seqs):
        for dt in DTYPES:
            d = hds[(i + len(cases)) % len(hds)]
            causal, window, cap = r.choice(masks)
            h, hk = r.choice(heads)
            cases.append((2 if sq * sk < 100_000 else 1, sq, sk, h, hk, d, dt, causal, window, cap))
    for d in hds:  # every head dim, bf16 and fp16, causal GQA at an odd length
        for dt in ("bfloat16", "float16"):
            cases.append((1, 97, 130, 4, 2, d, dt, True, (-1, -1), 0.0))
    cases.append((1, 4097, 4097, 2, 1, 128, "bfloat16", True, (-1, -1), 0.0))
    cases.append((1, 2048, 2048, 2, 2, 64, "float16", False, (-1, -1), 0.0))
    return cases


ATTN_CASES = _attn_cases()


def _attn_id(c: tuple) -> str:
    b, sq, sk, h, hk, d, dt, causal, window, cap = c
    return f"b{b}-q{sq}-k{sk}-h{h}/{hk}-d{d}-{dt}-c{int(causal)}-w{window[0]}_{window[1]}-cap{cap}"


def attention_grads(
    q: Any, k: Any, v: Any, dout: Any, causal: bool, window: Any, cap: float, upcast: bool
) -> tuple[Any, ...]:
    """Gradients of torch math attention (float64 with upcast, else in the inputs' dtype)."""
    dt = torch.float64 if upcast else q.dtype
    leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
    out, _ = attention_torch(*leaves, None, causal, window, cap, upcast=upcast)
    return torch.autograd.grad(out, leaves, dout.to(dt))


def check_attention_grads(rule: Any, case: tuple, deterministic: bool = False) -> None:
    b, sq, sk, h, hk, d, dt, causal, window, cap = case
    dtype = DTYPES[dt]
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = torch.randn(b, sq, h, d, device="cuda").to(dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fst.flash_attn_func(
        *leaves, causal=causal, window_size=window, softcap=cap, deterministic=deterministic
    )
    got = torch.autograd.grad(out, leaves, dout)
    ref = attention_grads(q, k, v, dout, causal, window, cap, upcast=True)
    for name, g, like in zip(("dq", "dk", "dv"), got, (q, k, v)):
        assert g.dtype == dtype and g.shape == like.shape, name
    if dtype == torch.float32:
        # relative to the largest of the three gradients: one of them can be exactly 0 (a
        # single visible key makes dq vanish) while the others set the scale of the rounding
        scale = max(float(r.abs().max()) for r in ref)
        for name, g, r in zip(("dq", "dk", "dv"), got, ref):
            rule.rel(g, r, 0.0, atol=1e-4 * scale + 1e-6, name=f"{name} (float32)")
        return
    base = attention_grads(q, k, v, dout, causal, window, cap, upcast=False)
    for name, g, r, bs in zip(("dq", "dk", "dv"), got, ref, base):
        slack = 1e-4 * max(1.0, float(r.abs().max()))
        rule.check(g, r, bs, atol=slack, name=f"{name} ({dt})")


@pytest.fixture
def mma_bwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mma.sync backward for this test: on sm_90 the wgmma kernel is the default where it
    covers the call (its own matrix below), so the general matrix pins the kernel every other
    arch runs and that sm_90 keeps for fp32 and other head dims."""
    monkeypatch.setenv("FLASHSCAN_SM90_BWD", "0")


@pytest.mark.parametrize("case", ATTN_CASES, ids=[_attn_id(c) for c in ATTN_CASES])
def test_attention_backward_matrix(case: tuple, rule: Any, mma_bwd: None) -> None:
    check_attention_grads(rule, case)


@pytest.mark.parametrize(
    "case",
    [
        (2, 200, 333, 4, 1, 64, "bfloat16", True, (-1, -1), 0.0),
        (1, 129, 129, 2, 2, 128, "float16", False, (16, 16), 0.0),
    ],
    ids=["gqa-causal", "window"],
)
def test_attention_backward_deterministic(case: tuple, rule: Any, mma_bwd: None) -> None:
    check_attention_grads(rule, case, deterministic=True)
    b, sq, sk, h, hk, d, dt, causal, window, cap = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, DTYPES[dt])
    dout = torch.randn_like(q)
    runs = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fst.flash_attn_func(*leaves, causal=causal, window_size=window, deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for other in runs[1:]:
        for g0, g1 in zip(runs[0], other):
            assert torch.equal(g0, g1), "deterministic=True gave different bits"


def test_attention_backward_writes_every_element() -> None:
    """Gradient buffers poisoned with NaN: the native backward must overwrite all of them."""
    q, k, v = make_qkv(2, 77, 91, 4, 2, 64, torch.bfloat16)
    out, lse = flashscan.flash_attn_func(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    stream = torch.cuda.current_stream().cuda_stream
    scale = 64**-0.5
    flashscan._native.flash_attn_bwd(
        dout, q, k, v, out, lse, *grads, scale, -1, 0, 0.0, False, stream
    )
    for g in grads:
        assert not torch.isnan(g).any()


def test_attention_backward_errors() -> None:
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float16)
    out, lse = flashscan.flash_attn_func(q, k, v, return_lse=True)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises((ValueError, TypeError), match="dq"):
        flashscan._native.flash_attn_bwd(
            out, q, k, v, out, lse, dq[:, :8], dk, dv, 0.125, -1, -1, 0.0, False, stream
        )
    with pytest.raises((ValueError, TypeError), match="dout"):
        flashscan._native.flash_attn_bwd(
            out.float(), q, k, v, out, lse, dq, dk, dv, 0.125, -1, -1, 0.0, False, stream
        )
    with pytest.raises(ValueError):  # an output overlapping an input
        flashscan._native.flash_attn_bwd(
            out, q, k, v, out, lse, q, dk, dv, 0.125, -1, -1, 0.0, False, stream
        )


def test_attention_backward_nondefault_stream(rule: Any) -> None:
    s = torch.cuda.Stream()
    q, k, v = make_qkv(2, 300, 300, 4, 4, 64, torch.bfloat16)
    dout = torch.randn_like(q)
    ref = attention_grads(q, k, v, dout, True, (-1, -1), 0.0, upcast=True)
    base = attention_grads(q, k, v, dout, True, (-1, -1), 0.0, upcast=False)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        got = torch.autograd.grad(fst.flash_attn_func(*leaves, causal=True), leaves, dout)
    torch.cuda.current_stream().wait_stream(s)
    for g, r, b in zip(got, ref, base):
        rule.check(g, r, b, atol=1e-4)


def test_attention_forward_backward_in_a_cuda_graph(rule: Any) -> None:
    q, k, v = make_qkv(2, 128, 128, 4, 2, 64, torch.float16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)

    def step() -> tuple[Any, ...]:
        out = fst.flash_attn_func(*leaves, causal=True)
        return torch.autograd.grad(out, leaves, dout)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up: compile and cache outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = step()
    with torch.no_grad():
        for t, src in zip(leaves, make_qkv(2, 128, 128, 4, 2, 64, torch.float16)):
            t.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    ref = attention_grads(*leaves, dout, True, (-1, -1), 0.0, upcast=True)
    base = attention_grads(*leaves, dout, True, (-1, -1), 0.0, upcast=False)
    for c, r, b in zip(captured, ref, base):
        rule.check(c, r, b, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Attention on the sm_90a wgmma backward (cuda/flash_bwd_sm90.cu; the default on sm_90a,
# FLASHSCAN_SM90_BWD=0 turns it off)
# ---------------------------------------------------------------------------------------------

SM90_ENV = "FLASHSCAN_SM90_BWD"


def _sm90_covers(c: tuple) -> bool:
    """Dense fp16 / bf16, head dim exactly 64, 128 or 256 (softcap or not): what the wgmma
    kernel runs."""
    b, sq, sk, h, hk, d, dt, causal, window, cap = c
    return d in (64, 128, 256) and dt != "float32"


def _sm90_cases() -> list[tuple]:
    extra = [
        (2, 128, 128, 4, 4, 128, "bfloat16", False, (-1, -1), 0.0),
        (2, 333, 333, 4, 4, 128, "bfloat16", False, (-1, -1), 0.0),
        (2, 333, 333, 4, 2, 128, "float16", True, (-1, -1), 0.0),
        (1, 1000, 1000, 4, 1, 128, "bfloat16", True, (-1, -1), 0.0),
        (2, 200, 517, 4, 4, 128, "float16", True, (-1, -1), 0.0),
        (2, 517, 200, 4, 2, 128, "bfloat16", True, (-1, -1), 0.0),
        (1, 700, 700, 2, 2, 128, "bfloat16", False, (100, 30), 0.0),
        (2, 1, 129, 4, 4, 128, "float16", False, (-1, -1), 0.0),
        (2, 129, 1, 2, 2, 128, "bfloat16", False, (-1, -1), 0.0),
        (2, 7, 7, 2, 2, 64, "bfloat16", False, (-1, -1), 0.0),
        (2, 256, 256, 4, 4, 64, "float16", False, (-1, -1), 0.0),
        (1, 777, 777, 4, 2, 64, "bfloat16", True, (-1, -1), 0.0),
        (2, 300, 650, 2, 2, 64, "float16", False, (64, 0), 0.0),
        (1, 65, 63, 4, 1, 64, "bfloat16", True, (48, -1), 0.0),
        (1, 4097, 4097, 2, 1, 128, "bfloat16", True, (-1, -1), 0.0),
        (1, 2048, 2048, 2, 2, 64, "float16", False, (-1, -1), 0.0),
        # hd256 (the column-split form: 64-key blocks, 64-query steps, dQ by vector REDs)
        (2, 333, 333, 4, 2, 256, "bfloat16", False, (-1, -1), 0.0),
        (1, 300, 517, 4, 4, 256, "float16", True, (-1, -1), 0.0),
        (2, 517, 200, 4, 2, 256, "bfloat16", True, (-1, -1), 0.0),
        (1, 700, 700, 2, 2, 256, "bfloat16", False, (100, 30), 0.0),
        (2, 1, 129, 2, 2, 256, "float16", False, (-1, -1), 0.0),
        (2, 129, 1, 2, 1, 256, "bfloat16", False, (-1, -1), 0.0),
        (2, 65, 63, 4, 1, 256, "bfloat16", True, (48, -1), 0.0),
        (2, 64, 64, 2, 2, 256, "float16", False, (-1, -1), 0.0),
        (1, 2048, 2048, 2, 2, 256, "bfloat16", True, (-1, -1), 0.0),
        # softcap (tanh recomputed from S^T, P^T formed twice, masked th = -inf)
        (2, 333, 333, 4, 2, 256, "bfloat16", True, (-1, -1), 50.0),
        (1, 300, 517, 4, 4, 128, "float16", False, (-1, -1), 20.0),
        (2, 129, 200, 4, 1, 64, "bfloat16", True, (48, -1), 5.0),
        (1, 700, 700, 2, 2, 128, "bfloat16", False, (100, 30), 1.0),
        (2, 65, 63, 2, 2, 64, "float16", False, (-1, -1), 30.0),
        (1, 2048, 2048, 2, 2, 256, "bfloat16", True, (-1, -1), 50.0),
    ]
    return [c for c in ATTN_CASES if _sm90_covers(c)] + extra


SM90_CASES = _sm90_cases()


@pytest.fixture(params=["tma", "cp.async"])
def sm90_bwd(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wgmma backward for this test, set explicitly (the default, but a caller's
    FLASHSCAN_SM90_BWD=0 must not turn these tests into mma.sync runs), in its TMA build (Q / dO
    by tensor maps, the default) and its cp.async build (what runs where the driver refuses a
    map: FLASHSCAN_SM90_BWD_TMA=0); sm_90 GPUs only."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma backward runs on sm_90 (H100 / H200) only")
    monkeypatch.setenv(SM90_ENV, "1")
    monkeypatch.setenv("FLASHSCAN_SM90_BWD_TMA", "1" if request.param == "tma" else "0")


@pytest.mark.parametrize("case", SM90_CASES, ids=[_attn_id(c) for c in SM90_CASES])
def test_attention_backward_sm90_matrix(case: tuple, rule: Any, sm90_bwd: None) -> None:
    check_attention_grads(rule, case)


def test_attention_backward_sm90_writes_every_element(sm90_bwd: None) -> None:
    """NaN-poisoned gradient buffers through the native call with the wgmma backward."""
    for d, causal in ((64, True), (128, False), (128, True), (256, False), (256, True)):
        q, k, v = make_qkv(2, 77, 291, 4, 2, d, torch.bfloat16)
        out, lse = flashscan.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        dout = torch.randn_like(out)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        stream = torch.cuda.current_stream().cuda_stream
        flashscan._native.flash_attn_bwd(
            dout, q, k, v, out, lse, *grads, d**-0.5, -1, 0 if causal else -1, 0.0, False, stream
        )
        for g in grads:
            assert not torch.isnan(g).any()


def test_attention_backward_sm90_in_a_cuda_graph(rule: Any, sm90_bwd: None) -> None:
    test_attention_forward_backward_in_a_cuda_graph(rule)


# deterministic=True on the wgmma kernel: launches of nsplit CTAs per (batch, kv head), each on
# its own accumulator slice (attention_bwd.rs walk_split; on 132 SMs: b4 x 16 kv heads over 8 kv
# blocks -> 2 slices x 4 launches, b4 x 8 -> 4 x 2, hd256 b2 x 8 over 11 blocks of 64 keys ->
# 6 x 2, b2 x 4 -> 8 slices in one launch)
SM90_DET_CASES = [
    (4, 1000, 1000, 16, 16, 128, "bfloat16", False, (-1, -1), 0.0),
    (4, 1000, 1000, 16, 8, 64, "float16", True, (-1, -1), 0.0),
    (2, 700, 700, 16, 8, 256, "bfloat16", True, (-1, -1), 0.0),
    (2, 517, 900, 16, 4, 128, "float16", False, (100, 30), 20.0),
    (4, 333, 1000, 8, 8, 64, "bfloat16", True, (48, -1), 5.0),
]


@pytest.mark.parametrize("case", SM90_DET_CASES, ids=[_attn_id(c) for c in SM90_DET_CASES])
def test_attention_backward_sm90_deterministic(case: tuple, rule: Any, sm90_bwd: None) -> None:
    """Correct by the rule, and the same bits in three runs."""
    check_attention_grads(rule, case, deterministic=True)
    b, sq, sk, h, hk, d, dt, causal, window, cap = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, DTYPES[dt])
    dout = torch.randn_like(q)
    runs = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fst.flash_attn_func(
            *leaves, causal=causal, window_size=window, softcap=cap, deterministic=True
        )
        runs.append(torch.autograd.grad(out, leaves, dout))
    for other in runs[1:]:
        for g0, g1 in zip(runs[0], other):
            assert torch.equal(g0, g1), "deterministic=True gave different bits"


_SM90_CHILD = """
import torch, flashscan.torch as fst
for d in (64, 128, 256):
  for det in (False, True):
    q, k, v = (torch.randn(1, 300, 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = fst.flash_attn_func(q, k, v, causal=True, deterministic=det)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
torch.cuda.synchronize()
print("ok")
"""


@pytest.mark.parametrize("switch", [None, "1", "0"])
def test_attention_backward_sm90_kernel_is_what_runs(tmp_path: Any, switch: str | None) -> None:
    """A child with its own kernel cache builds the wgmma backward (hd64, hd128 and hd256
    variants, each plain and deterministic) by default and with the switch at 1, and none of it
    at 0: the switch reaches the launcher and the default is what it says, no silent fallback."""
    import os
    import subprocess
    import sys

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma backward runs on sm_90 (H100 / H200) only")
    env = {k: v for k, v in os.environ.items() if k != SM90_ENV}
    env["FLASHSCAN_CACHE_DIR"] = str(tmp_path)
    if switch is not None:
        env[SM90_ENV] = switch
    done = subprocess.run(
        [sys.executable, "-c", _SM90_CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    built = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("flash_bwd_sm90-"))
    want = 0 if switch == "0" else 6
    assert len(built) == want, f"wgmma backward builds: {sorted(os.listdir(tmp_path))}"
    if switch == "0":  # the mma.sync main kernel ran instead
        assert any(p.name.startswith("flash_bwd-") for p in tmp_path.iterdir())


def test_attention_compiled_training_step_matches_eager() -> None:
    torch._dynamo.reset()
    q, k, v = make_qkv(2, 256, 256, 4, 4, 64, torch.bfloat16)

    def loss(q: Any, k: Any, v: Any) -> Any:
        return fst.flash_attn_func(q, k, v, causal=True).float().square().mean()

    le = [t.clone().requires_grad_() for t in (q, k, v)]
    lc = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = torch.autograd.grad(loss(*le), le)
    compiled = torch.compile(loss, fullgraph=True)
    got = torch.autograd.grad(compiled(*lc), lc)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------

SEQLENS = [1, 2, 7, 60, 64, 2047, 4096, 100000]
DSTATES = [1, 4, 16, 64, 256]
# gradients that sum over batch and time (or over channels): float32 relative tolerance
SUM_RTOL = 1e-3
ELEM_RTOL = 1e-4


def _scan_cases() -> list[tuple]:
    r = random.Random(6061)
    forms = [("fixed", 1), ("varying", 1), ("grouped", 2), ("grouped", 4)]
    cases = []
    for L in SEQLENS:
        for dt in DTYPES:
            bc, g = r.choice(forms)
            n = r.choice([4, 16, 16, 64]) if L < 100000 else 16
            cases.append((L, dt, n, bc, g, r.random() < 0.7, r.random() < 0.6, r.random() < 0.5))
    for n in DSTATES:
        for dt in DTYPES:
            bc, g = r.choice(forms)
            cases.append((r.choice([63, 200]), dt, n, bc, g, True, True, r.random() < 0.5))
    return cases


SCAN_CASES = _scan_cases()


def _scan_id(c: tuple) -> str:
    L, dt, n, bc, g, extras, softplus, init = c
    return f"L{L}-{dt}-n{n}-{bc}{g}-x{int(extras)}-sp{int(softplus)}-init{int(init)}"


def check_grad(rule: Any, got: Any, ref: Any, name: str, summed: bool) -> None:
    if got.dtype == torch.float32:
        rule.rel(got, ref, SUM_RTOL if summed else ELEM_RTOL, atol=1e-6, name=f"{name} (f32)")
    else:
        scale = float(ref.abs().max())
        rule.check(got, ref, ref.to(got.dtype), atol=1e-5 * max(scale, 1.0), name=name)


@pytest.mark.parametrize("case", SCAN_CASES, ids=[_scan_id(c) for c in SCAN_CASES])
def test_scan_backward_matrix(case: tuple, rule: Any) -> None:
    check_scan_backward(case, *_size(case[0], case[2]), rule)


# Short sequences at dstate 16 around the backward's small-grid plan (16 lanes a channel while
# the grid has <= one block per SM, src/ops/scan_bwd.rs `small_grid_tiles`): (case, batch, dim)
SHORT_BWD = [
    ((60, "bfloat16", 16, "varying", 1, True, True, False), 1, 523),  # 16 lanes
    ((64, "float32", 16, "grouped", 2, True, True, True), 4, 512),  # 16 lanes, 128 blocks
    ((33, "float16", 16, "grouped", 4, True, False, True), 8, 512),  # 8 lanes (256 blocks)
]


@pytest.mark.parametrize("short", SHORT_BWD, ids=lambda s: f"{_scan_id(s[0])}-b{s[1]}-d{s[2]}")
def test_scan_backward_short_sequence_plans(short: tuple, rule: Any) -> None:
    check_scan_backward(*short, rule)


def check_scan_backward(case: tuple, batch: int, dim: int, rule: Any) -> None:
    L, dt, n, bc, g, extras, softplus, init = case
    dtype = DTYPES[dt]
    x = scan_inputs(batch, dim, L, n, dtype, bc, g)
    args = {
        "u": x["u"],
        "delta": x["delta"] if softplus else x["delta"].float().clamp(0.01, 0.5).to(dtype),
        "A": x["A"],
        "B": x["B"],
        "C": x["C"],
        "D": x["D"] if extras else None,
        "z": x["z"] if extras else None,
        "delta_bias": x["delta_bias"] if extras and softplus else None,
        "initial_state": torch.randn(batch, dim, n, device="cuda") if init else None,
    }
    names = [k for k, t in args.items() if t is not None]
    leaves = {k: t.clone().requires_grad_() for k, t in args.items() if t is not None}
    y, last = fst.selective_scan_fn(
        **{k: leaves.get(k) for k in args}, delta_softplus=softplus, return_last_state=True
    )
    dout = torch.randn_like(y)
    dlast = torch.randn_like(last)
    got = torch.autograd.grad((y, last), [leaves[k] for k in names], (dout, dlast))

    leaves64 = {k: t.detach().double().requires_grad_() for k, t in args.items() if t is not None}
    y64, last64 = scan_ref(**{k: leaves64.get(k) for k in args}, delta_softplus=softplus)
    ref = torch.autograd.grad(
        (y64, last64), [leaves64[k] for k in names], (dout.double(), dlast.double())
    )
    summed = {"A", "B", "C", "D", "delta_bias"}  # dB/dC: over time (fixed) or channels
    for k, gk, rk in zip(names, got, ref):
        assert gk.dtype == args[k].dtype and gk.shape == args[k].shape, k
        check_grad(rule, gk, rk, f"d{k}", k in summed)


def test_scan_backward_without_saved_states_matches(rule: Any) -> None:
    """The backward recomputes chunk states itself when the forward saved none."""
    x = scan_inputs(2, 64, 5000, 16, torch.bfloat16)
    args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    leaves = [t.clone().requires_grad_() for t in args]
    y = fst.selective_scan_fn(*leaves, delta_softplus=True)
    dout = torch.randn_like(y)
    with_saved = torch.autograd.grad(y, leaves, dout)
    out, last, saved = torch.ops.flashscan.selective_scan_fwd(*args, None, True, True)
    assert saved.shape[2] == fst._saved_count(5000)
    recomputed = torch.ops.flashscan.selective_scan_bwd(
        dout, None, *args, None, saved.new_empty((0,)), True
    )
    for name, a, b in zip(
        ("u", "delta", "A", "B", "C", "D", "z", "delta_bias"), with_saved, recomputed
    ):
        rule.same_up_to_order(b, a, name=f"d{name} recomputed vs saved")


@pytest.mark.parametrize("dim", [0, 36, 512])
@pytest.mark.parametrize("form", [("varying", 1), ("grouped", 4)])
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_scan_backward_16bit_db_dc_are_the_float32_sums_rounded_once(
    dim: int, form: tuple, dt: str
) -> None:
    """dB / dC asked for in B's 16-bit dtype (summed in float32 scratch, rounded by the last
    launch) equal the float32 outputs of the same call rounded by torch, over NaN-poisoned
    outputs: mostly bit for bit, every element within one 16-bit rounding step of the
    tensor's scale (the float32 sums are atomics: two calls may differ in their last bits, by
    more than a unit of a small element whose terms cancel, and round apart); with dim 0
    (nothing summed) they are written as zeros."""
    from flashscan import _native

    dtype = DTYPES[dt]
    batch, L, n = 3, 333, 16
    x = scan_inputs(batch, max(dim, 1), L, n, dtype, form[0], form[1])
    if dim == 0:
        for k in ("u", "delta", "z"):
            x[k] = x[k][:, :0]
        for k in ("A",):
            x[k] = x[k][:0]
        for k in ("D", "delta_bias"):
            x[k] = x[k][:0]
    u, delta, A, B, C, D, z, bias = (
        x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    )
    dout = torch.randn_like(u)
    d = fst._desc
    stream = torch.cuda.current_stream().cuda_stream

    def run(bc_dtype: Any) -> tuple[Any, Any]:
        grads = [torch.full_like(t, float("nan")) for t in (u, delta, z)]
        small = [torch.full_like(t, float("nan")) for t in (A, D, bias)]
        db = torch.full(B.shape, float("nan"), dtype=bc_dtype, device="cuda")
        dc = torch.full(C.shape, float("nan"), dtype=bc_dtype, device="cuda")
        _native.selective_scan_bwd(
            d(u, "u"), d(delta, "delta"), d(A, "A"), d(B, "B"), d(C, "C"), d(D, "D"),
            d(z, "z"), d(bias, "delta_bias"), None, d(dout, "dout"), None, None,
            d(grads[0], "du"), d(grads[1], "ddelta"), d(small[0], "dA"), d(db, "dB"),
            d(dc, "dC"), d(small[1], "dD"), d(grads[2], "dz"), d(small[2], "ddelta_bias"),
            None, True, stream,
        )  # fmt: skip
        return db, dc

    db32, dc32 = run(torch.float32)
    db16, dc16 = run(dtype)
    torch.cuda.synchronize()
    eps = torch.finfo(dtype).eps
    for got, want in ((db16, db32), (dc16, dc32)):
        assert not want.isnan().any() and not got.isnan().any()
        scale = float(want.abs().max())
        torch.testing.assert_close(got.float(), want, rtol=eps, atol=eps * scale)
        assert (got == want.to(dtype)).float().mean() > 0.99
    if dim == 0:
        assert not db16.any() and not dc16.any()
    else:
        assert db16.abs().max() > 0 and dc16.abs().max() > 0


REPLAY_CASES = [
    # (dtype, B/C form, groups, L, extras (D, z, delta_bias), initial_state, return_last)
    ("bfloat16", "varying", 1, 60, True, False, False),  # the real-time training layer
    ("float16", "grouped", 2, 300, True, True, True),  # saved states (L > 256), dlast
    ("float32", "fixed", 1, 33, False, False, True),
]


@pytest.mark.parametrize("case", REPLAY_CASES, ids=lambda c: f"{c[0]}-{c[1]}{c[2]}-L{c[3]}")
def test_scan_replay_plans_compute_what_the_descriptor_calls_do(case: tuple) -> None:
    """flashscan.torch's third step of a signature runs the forward and backward through
    their native replay plans (raw pointers): same outputs as the first step's descriptor
    calls (bit for bit; gradients summed with float32 atomics within their rounding), on
    fresh leaves each step so a stale pointer would show."""
    dt, bc, g, L, extras, init, last = case
    dtype = DTYPES[dt]
    batch, dim, n = 3, 64, 16
    x = scan_inputs(batch, dim, L, n, dtype, bc, g)
    args = {
        "u": x["u"],
        "delta": x["delta"],
        "A": x["A"],
        "B": x["B"],
        "C": x["C"],
        "D": x["D"] if extras else None,
        "z": x["z"] if extras else None,
        "delta_bias": x["delta_bias"] if extras else None,
        "initial_state": torch.randn(batch, dim, n, device="cuda") if init else None,
    }
    names = [k for k, t in args.items() if t is not None]
    fst._SCAN_LEAN.clear()
    fst._SCAN_LAST = (None, None)
    results = []
    for _ in range(3):
        leaves = {k: t.clone().requires_grad_() for k, t in args.items() if t is not None}
        r = fst.selective_scan_fn(
            **{k: leaves.get(k) for k in args}, delta_softplus=True, return_last_state=last
        )
        outs = r if isinstance(r, tuple) else (r,)
        g_outs = [torch.full_like(o, 0.5) for o in outs]
        grads = torch.autograd.grad(outs, [leaves[k] for k in names], g_outs)
        results.append(([o.detach().clone() for o in outs], grads))
    lean = fst._SCAN_LEAN.get(fst._SCAN_LAST[0])
    assert lean is not None and any(lean[0][-1].values()), "no replay plan was kept"
    (o1, g1), (o3, g3) = results[0], results[2]
    for a, b in zip(o1, o3):
        assert torch.equal(a, b)
    for k, a, b in zip(names, g1, g3):
        assert a.dtype == b.dtype == args[k].dtype, k
        scale = float(a.float().abs().max())
        torch.testing.assert_close(b.float(), a.float(), rtol=1e-2, atol=1e-3 * scale + 1e-6)


def test_scan_replay_launch_refuses_pointers_unlike_the_plan() -> None:
    """A replay plan's launch checks what pointers alone can break: an optional left out or
    given unlike the planned call, a null pointer, a pointer off its element alignment."""
    from flashscan import _native

    x = scan_inputs(2, 32, 40, 16, torch.bfloat16)
    u, delta, A, B, C, D = (x[k] for k in ("u", "delta", "A", "B", "C", "D"))
    out = torch.empty_like(u)
    d = fst._desc
    r = _native.selective_scan_fwd(
        d(u, "u"), d(delta, "delta"), d(A, "A"), d(B, "B"), d(C, "C"), d(D, "D"),
        None, None, None, d(out, "out"), None, True, None, replay=True,
    )  # fmt: skip
    assert r is not None
    stream = torch.cuda.current_stream().cuda_stream
    ptrs = [t.data_ptr() for t in (u, delta, A, B, C, D)] + [0, 0, 0, out.data_ptr(), 0, 0]
    r.launch(*ptrs, stream)
    want = torch.empty_like(u)
    _native.selective_scan_fwd(
        d(u, "u"), d(delta, "delta"), d(A, "A"), d(B, "B"), d(C, "C"), d(D, "D"),
        None, None, None, d(want, "out"), None, True, stream,
    )  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    for i, bad in ((5, 0), (6, u.data_ptr()), (0, 0), (0, u.data_ptr() + 1)):
        p = list(ptrs)
        p[i] = bad
        with pytest.raises(ValueError):
            r.launch(*p, stream)


def test_scan_forward_saving_keeps_outputs(rule: Any) -> None:
    x = scan_inputs(2, 32, 4500, 16, torch.float32)
    args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    plain, plain_last = flashscan.selective_scan_fn(
        *args, delta_softplus=True, return_last_state=True
    )
    out, last, saved = torch.ops.flashscan.selective_scan_fwd(*args, None, True, True)
    assert torch.equal(out, plain) and torch.equal(last, plain_last)
    # the saved states are the states after each chunk of _SAVE_CHUNK steps
    assert saved.shape == (2, 32, fst._saved_count(4500), 16)
    for c in (0, saved.shape[2] - 1):
        _, mid = flashscan.selective_scan_fn(
            *(t[..., : (c + 1) * fst._SAVE_CHUNK] if t.dim() == 3 else t for t in args),
            delta_softplus=True,
            return_last_state=True,
        )
        torch.testing.assert_close(saved[:, :, c], mid, atol=1e-5, rtol=1e-5)
