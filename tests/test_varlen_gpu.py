"""GPU tests of `flash_attn_varlen_func` (issue 12): the FS_VARLEN builds of the dense forward
and backward kernels over ragged packed batches.

Correctness rule of DESIGN.md per packed batch: reference = torch math attention in float64 per
sequence (test_attention_gpu.attention_torch), baseline = the same math in the inputs' dtype;
gradients against float64 autograd (test_backward_gpu.attention_grads), float32 to 1e-4
relative. Ragged lengths with 0, 1, tile edges (63/64/65, 127/128/129) and sq != sk per
sequence, every head-dim tile, GQA/MQA, causal/window/softcap, fp16/bf16/fp32. Also: outputs
poisoned (out= NaN), bit-equality with the dense call at equal lengths, deterministic backward,
out-of-range device cu_seqlens (clamped; FLASHSCAN_CHECK_INDICES=1 raises), CUDA graphs. The
backward matrix runs on sm_90 on the wgmma kernel's varlen builds (the default there at head
dims 64 / 128 / 256, fp16 / bf16: TMA, and cp.async with FLASHSCAN_SM90_BWD_TMA=0) and with
FLASHSCAN_SM90_BWD=0 on the mma.sync kernel.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

import flashscan

torch = pytest.importorskip("torch")

from test_attention_gpu import attention_torch  # noqa: E402
from test_backward_gpu import attention_grads  # noqa: E402

import flashscan.torch as fst  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
MASKS = {
    "none": (False, (-1, -1), 0.0),
    "causal": (True, (-1, -1), 0.0),
    "window": (False, (48, 16), 0.0),
    "causal-window": (True, (100, -1), 0.0),
    "softcap": (False, (-1, -1), 30.0),
    "causal-softcap": (True, (-1, -1), 5.0),
}
# (q lengths, k lengths) per batch
RAGGED = {
    "edges": ([63, 0, 1, 65, 128, 129], [64, 5, 0, 65, 127, 300]),
    "decode": ([1, 1, 1, 1], [1, 77, 1000, 4097]),
    "prefill": ([1000, 7, 513], [1000, 7, 513]),
    "chunked": ([64, 200], [1064, 900]),
    "single": ([4097], [4097]),
}
HEADDIMS = [32, 64, 96, 128, 192, 256, 40, 136]


def cu(lens: list[int]) -> Any:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")


def packed(lq: list[int], lk: list[int], h: int, hk: int, d: int, dtype: Any) -> tuple[Any, ...]:
    g = torch.Generator(device="cuda").manual_seed(random.getrandbits(62))
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda").to(dtype)  # noqa: E731
    return mk(sum(lq), h, d), mk(sum(lk), hk, d), mk(sum(lk), hk, d), cu(lq), cu(lk)


def per_sequence(fn: Any, lq: list[int], lk: list[int], q: Any, *rest: Any) -> list[Any]:
    """fn(q_b, k_b, v_b, ...) on each sequence as a batch-1 dense problem."""
    res = []
    cq, ck = cu(lq).tolist(), cu(lk).tolist()
    for b in range(len(lq)):
        qs = q[None, cq[b] : cq[b + 1]]
        ks = [t[None, ck[b] : ck[b + 1]] for t in rest[:2]]
        res.append(fn(qs, *ks, *[t[None, cq[b] : cq[b + 1]] for t in rest[2:]]))
    return res


def reference(lq, lk, q, k, v, causal, window, cap, upcast):  # type: ignore[no-untyped-def]
    """(out (total_q, h, d), lse (h, total_q)) per sequence by torch math attention; a sequence
    with no keys gives 0 / -inf, as the kernels."""
    outs, lses = [], []
    for o, lse in per_sequence(
        lambda qs, ks, vs: attention_torch(qs, ks, vs, None, causal, window, cap, upcast),
        lq,
        lk,
        q,
        k,
        v,
    ):
        outs.append(o[0])
        lses.append(lse[0].to(torch.float64))
    return torch.cat(outs), torch.cat(lses, dim=1)


def _cases() -> list[tuple]:
    r = random.Random(1212)
    cases = []
    for i, name in enumerate(RAGGED):
        for dt in DTYPES:
            for mask in MASKS:
                d = HEADDIMS[(i + len(cases)) % len(HEADDIMS)]
                h, hk = r.choice([(4, 4), (8, 2), (4, 1)])
                cases.append((name, h, hk, d, dt, mask))
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_forward_matrix(case: tuple, rule: Any) -> None:
    name, h, hk, d, dt, mask = case
    lq, lk = RAGGED[name]
    causal, window, cap = MASKS[mask]
    q, k, v, cq, ck = packed(lq, lk, h, hk, d, DTYPES[dt])
    out = torch.full_like(q, float("nan"))
    o, lse = flashscan.flash_attn_varlen_func(
        q, k, v, cq, ck, max(lq), max(lk), None, causal, window, cap, True, out
    )
    assert o is out and lse.shape == (h, sum(lq)) and lse.dtype == torch.float32
    torch.cuda.synchronize()
    ref_o, ref_l = reference(lq, lk, q, k, v, causal, window, cap, upcast=True)
    base_o, base_l = reference(lq, lk, q, k, v, causal, window, cap, upcast=False)
    slack = 1e-5 * max(1.0, float(ref_o.abs().max()))
    rule.check(out, ref_o, base_o, atol=slack, name=f"out ({dt})")
    rule.check(lse, ref_l, base_l, atol=1e-4, name="lse")


BWD_CASES = [
    ("edges", 4, 2, 64, "bfloat16", "causal"),
    ("edges", 4, 4, 128, "float16", "window"),
    ("chunked", 8, 2, 128, "bfloat16", "causal"),
    ("prefill", 4, 1, 96, "float16", "causal-softcap"),
    ("decode", 4, 2, 64, "bfloat16", "none"),
    ("edges", 2, 2, 40, "float32", "causal"),
    ("prefill", 2, 1, 256, "bfloat16", "causal-window"),
    # the wgmma backward's varlen build (sm_90): every head dim, softcap, windows, GQA / MQA,
    # empty and one-row sequences, a sequence longer than one CTA's keys and queries
    ("edges", 4, 1, 256, "float16", "window"),
    ("decode", 8, 2, 128, "float16", "softcap"),
    ("single", 4, 2, 128, "bfloat16", "causal"),
    ("chunked", 4, 4, 64, "float16", "causal-softcap"),
    ("prefill", 2, 2, 256, "float16", "softcap"),
    ("edges", 8, 8, 128, "bfloat16", "causal-window"),
]
SM90_ENV = "FLASHSCAN_SM90_BWD"


def check_grads(case: tuple, rule: Any, deterministic: bool = False) -> None:
    name, h, hk, d, dt, mask = case
    lq, lk = RAGGED[name]
    causal, window, cap = MASKS[mask]
    dtype = DTYPES[dt]
    q, k, v, cq, ck = packed(lq, lk, h, hk, d, dtype)
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fst.flash_attn_varlen_func(
        *leaves, cq, ck, max(lq), max(lk), None, causal, window, cap, deterministic=deterministic
    )
    got = torch.autograd.grad(out, leaves, dout)

    def grads(upcast: bool) -> list[Any]:
        per = per_sequence(
            lambda qs, ks, vs, ds: attention_grads(qs, ks, vs, ds, causal, window, cap, upcast),
            lq,
            lk,
            q,
            k,
            v,
            dout,
        )
        return [torch.cat([g[i][0] for g in per]) for i in range(3)]

    ref = grads(True)
    if dtype == torch.float32:
        scale = max(float(r.abs().max()) for r in ref)
        for nm, g, r in zip(("dq", "dk", "dv"), got, ref):
            rule.rel(g, r, 0.0, atol=1e-4 * scale + 1e-6, name=f"{nm} (float32)")
        return
    base = grads(False)
    for nm, g, r, bs in zip(("dq", "dk", "dv"), got, ref, base):
        rule.check(g, r, bs, atol=1e-4 * max(1.0, float(r.abs().max())), name=f"{nm} ({dt})")


@pytest.mark.parametrize(
    "sm90,tma", [("1", "1"), ("1", "0"), ("0", "1")], ids=["default", "cp-async", "mma-sync"]
)
@pytest.mark.parametrize("case", BWD_CASES, ids=["-".join(map(str, c)) for c in BWD_CASES])
def test_backward_matrix(case: tuple, sm90: str, tma: str, rule: Any, monkeypatch: Any) -> None:
    # read on every call; "1" / "1" is the default: the wgmma kernel's TMA build on sm_90
    monkeypatch.setenv(SM90_ENV, sm90)
    monkeypatch.setenv("FLASHSCAN_SM90_BWD_TMA", tma)
    check_grads(case, rule)


_SM90_VARLEN_CHILD = """
import torch, flashscan.torch as fst
lq, lk = [100, 1, 333], [120, 40, 333]
cq = torch.tensor([0, 100, 101, 434], dtype=torch.int32, device="cuda")
ck = torch.tensor([0, 120, 160, 493], dtype=torch.int32, device="cuda")
q = torch.randn(434, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(493, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(2))
out = fst.flash_attn_varlen_func(q, k, v, cq, ck, 333, 333, causal=True)
torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
torch.cuda.synchronize()
print("ok")
"""


@pytest.mark.parametrize("switch", [None, "0"])
def test_sm90_varlen_backward_is_what_runs(tmp_path: Any, switch: str | None) -> None:
    """A child with its own kernel cache builds one wgmma backward variant (the varlen
    cp.async build) for a packed hd128 call by default, and none with the switch at 0."""
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
        [sys.executable, "-c", _SM90_VARLEN_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    built = [p.name for p in tmp_path.iterdir() if p.name.startswith("flash_bwd_sm90-")]
    assert len(built) == (0 if switch == "0" else 1), sorted(os.listdir(tmp_path))


# (the wgmma kernel's walk: "chunked" (2 sequences, 9 kv blocks of 128) takes 9 slices in one
# launch, "decode" (4 sequences up to 4097 keys) 11 slices x 3 launches on 132 SMs)
@pytest.mark.parametrize(
    "sm90,tma,d,name",
    [
        ("1", "1", 64, "chunked"),
        ("1", "1", 128, "decode"),
        ("1", "1", 256, "chunked"),
        ("1", "0", 128, "decode"),
        ("0", "1", 64, "chunked"),
    ],
    ids=["default-d64", "default-d128-decode", "default-d256", "cp-async-d128-decode", "mma-sync"],
)
def test_backward_deterministic_is_bit_reproducible(
    sm90: str, tma: str, d: int, name: str, rule: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv(SM90_ENV, sm90)
    monkeypatch.setenv("FLASHSCAN_SM90_BWD_TMA", tma)
    case = (name, 4, 2, d, "bfloat16", "causal")
    check_grads(case, rule, deterministic=True)
    lq, lk = RAGGED[name]
    q, k, v, cq, ck = packed(lq, lk, 4, 2, d, torch.bfloat16)
    dout = torch.randn_like(q)
    runs = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fst.flash_attn_varlen_func(
            *leaves, cq, ck, max(lq), max(lk), causal=True, deterministic=True
        )
        runs.append(torch.autograd.grad(out, leaves, dout))
    for other in runs[1:]:
        for g0, g1 in zip(runs[0], other):
            assert torch.equal(g0, g1)


@pytest.mark.parametrize("causal", [False, True])
def test_equal_lengths_match_the_dense_call_bit_for_bit(causal: bool) -> None:
    """Same tiles, same order of work: the packed call of b equal sequences is the dense one."""
    # hd96: the dense call runs the mma.sync kernel on every arch, as varlen calls do (hd64 and
    # hd128 take the sm_90a wgmma kernels on Hopper, whose order of work differs)
    b, s, h, hk, d = 3, 200, 4, 2, 96
    q, k, v, cq, ck = packed([s] * b, [s] * b, h, hk, d, torch.bfloat16)
    o, lse = flashscan.flash_attn_varlen_func(q, k, v, cq, ck, s, s, causal=causal, return_lse=True)
    od, lsed = flashscan.flash_attn_func(
        q.view(b, s, h, d),
        k.view(b, s, hk, d),
        v.view(b, s, hk, d),
        causal=causal,
        return_lse=True,
    )
    assert torch.equal(o.view(b, s, h, d), od)
    assert torch.equal(lse.view(h, b, s).transpose(0, 1), lsed)


def test_bad_device_cu_seqlens_are_clamped_or_checked(monkeypatch: Any) -> None:
    q = torch.randn(20, 2, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(10, 2, 64, device="cuda", dtype=torch.bfloat16)
    wild = torch.tensor([-5, 30, 7, 1 << 30], dtype=torch.int32, device="cuda")
    flashscan.flash_attn_varlen_func(q, k, k, wild, wild, 64, 64)  # no fault: clamped
    torch.cuda.synchronize()
    monkeypatch.setenv("FLASHSCAN_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flashscan.flash_attn_varlen_func(q, k, k, wild, wild, 64, 64)


def test_cuda_graph_capture_and_replay(rule: Any) -> None:
    lq, lk = [60, 1, 129], [70, 9, 129]
    q, k, v, cq, ck = packed(lq, lk, 4, 2, 64, torch.bfloat16)
    out = torch.empty_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture
        flashscan.flash_attn_varlen_func(q, k, v, cq, ck, 129, 129, causal=True, out=out)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashscan.flash_attn_varlen_func(q, k, v, cq, ck, 129, 129, causal=True, out=out)
    for _ in range(2):
        nq, nk, nv, _, _ = packed(lq, lk, 4, 2, 64, torch.bfloat16)
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref, _ = reference(lq, lk, q, k, v, True, (-1, -1), 0.0, upcast=True)
        base, _ = reference(lq, lk, q, k, v, True, (-1, -1), 0.0, upcast=False)
        rule.check(out, ref, base, atol=1e-5, name="graph replay")
