"""GPU tests of `mamba_chunk_scan_combined` (the SSD forward kernels of cuda/ssd.cu and the
backward kernels of cuda/ssd_bwd.cu).

Reference: `flashscan.reference_ssd` in float64 on the host. Baseline for fp16/bf16 outputs (the
correctness rule): a plain torch chunked SSD in the input dtype (C B^T, the masked weights, W x,
the chunk states and C H^T as dtype matmuls; decays and state passing in float32), i.e. what a
same-precision implementation gets; fp32 outputs: 1e-4 relative to the float64 reference. The
final states (fp32) are held to 1e-4 relative for fp32 inputs and to the rule against the
baseline's states otherwise. Also: poisoned outputs, seq_idx resets, strided (Mamba-2 split)
inputs, streaming with initial states, CUDA graph capture, the errors of the GPU path.
Backward: every input's gradient (with dout and dfinal_states) against the float64 reference
backward on the same (rounded) inputs; baseline = autograd through the plain torch SSD above
in the input dtype; slack = half an output ulp of the largest reference element (the gradient
is stored in its input's dtype).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import reference_ssd

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FP32_RTOL = 1e-4


@pytest.fixture(params=["1", "2"], ids=["fwd1", "fwd2"])
def fwd_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a forward test under both SSD forward paths, each named explicitly:
    FLASHSCAN_SSD_FWD=1 (cuda/ssd.cu, what float32 always runs) and 2 (cuda/ssd_fwd2.cu, the
    default for float16 / bfloat16)."""
    monkeypatch.setenv("FLASHSCAN_SSD_FWD", request.param)
    if request.param == "2" and "float32" in request.node.name:
        pytest.skip("float32 data stays on the first forward path")
    return request.param


def ssd_inputs(b, L, h, p, g, n, dtype, *, D2=False, init=True, device="cuda"):
    def rnd(*s, scale=1.0):
        return (torch.randn(*s, device=device) * scale).to(dtype)

    return {
        "x": rnd(b, L, h, p),
        "dt": (torch.rand(b, L, h, device=device) * 2 - 2.5),  # softplus -> ~0.08..0.6
        "A": -torch.exp(torch.rand(h, device=device) * 2 - 1),
        "B": rnd(b, L, g, n, scale=n**-0.25),
        "C": rnd(b, L, g, n, scale=n**-0.25),
        "D": torch.randn((h, p) if D2 else (h,), device=device),
        "z": rnd(b, L, h, p),
        "dt_bias": torch.rand(h, device=device) * 0.5,
        "initial_states": torch.randn(b, h, p, n, device=device) * 0.5 if init else None,
    }


def ref64(a: dict[str, Any], chunk: int, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    host = {k: None if v is None else v.detach().double().cpu().numpy() for k, v in a.items()}
    return reference_ssd.mamba_chunk_scan_combined(
        **host, chunk_size=chunk, return_final_states=True, **kw
    )


def baseline_lowp(a: dict[str, Any], chunk: int, softplus: bool) -> tuple[Any, Any]:
    """The plain same-precision SSD (no seq_idx), torch on the GPU: (out, final states)."""
    x, B, C = a["x"], a["B"], a["C"]
    dtype = x.dtype
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dt = a["dt"].float() + a["dt_bias"].float()
    if softplus:
        dt = F.softplus(dt)
    dt = dt.clamp_min(0.0)
    Q = chunk
    nc = -(-L // Q)
    pad = nc * Q - L

    def chunks(t: Any) -> Any:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) if pad else t
        return t.reshape(b, nc, Q, *t.shape[2:])

    xs = chunks(x)
    Bh, Ch = (chunks(m.repeat_interleave(h // g, dim=2)) for m in (B, C))
    dts = chunks(dt)  # (b, c, Q, h)
    cum = torch.cumsum(dts * a["A"].float(), dim=2)
    seg = cum[:, :, :, None, :] - cum[:, :, None, :, :]  # (b, c, l, s, h)
    causal = torch.tril(torch.ones(Q, Q, dtype=torch.bool, device=x.device))[None, None, :, :, None]
    decay = torch.exp(seg.masked_fill(~causal, -math.inf))
    cb = torch.einsum("bclhn,bcshn->bclsh", Ch, Bh)
    w = (cb.float() * decay * dts[:, :, None, :, :]).to(dtype)
    y = torch.einsum("bclsh,bcshp->bclhp", w, xs).float()
    wend = (torch.exp(cum[:, :, -1:, :] - cum) * dts).to(dtype)  # (b, c, s, h)
    S = torch.einsum("bcsh,bcshp,bcshn->bchpn", wend, xs, Bh).float()
    H = (
        a["initial_states"].float()
        if a["initial_states"] is not None
        else x.new_zeros((b, h, p, n), dtype=torch.float32)
    )
    Hs = []
    for c in range(nc):
        Hs.append(H)
        H = torch.exp(cum[:, c, -1, :])[..., None, None] * H + S[:, c]
    Hin = torch.stack(Hs, dim=1).to(dtype)  # (b, c, h, p, n)
    y += torch.einsum("bclhn,bchpn->bclhp", Ch, Hin).float() * torch.exp(cum)[..., None]
    y = y.reshape(b, nc * Q, h, p)[:, :L]
    D = a["D"].float()
    y = y + (D if D.dim() == 2 else D[:, None]) * x.float()
    if a.get("z") is not None:
        y = y * F.silu(a["z"].float())
    return y.to(dtype), H


def check_case(rule: Any, got: Any, final: Any, a: dict, chunk: int, softplus: bool) -> None:
    ref_y, ref_h = ref64(a, chunk, dt_softplus=softplus)
    ref_y_t = torch.from_numpy(ref_y)
    if got.dtype == torch.float32:
        rule.rel(got, ref_y_t, FP32_RTOL, atol=1e-6)
        rule.rel(final, torch.from_numpy(ref_h), FP32_RTOL, atol=1e-6, name="final_states")
        return
    base_y, base_h = baseline_lowp(a, chunk, softplus)
    scale = float(ref_y_t.abs().max())
    rule.check(got, ref_y_t, base_y, atol=1e-5 * max(scale, 1.0))
    rule.check(final, torch.from_numpy(ref_h), base_h, atol=1e-5, name="final_states")


# (dtype, ngroups, dstate, headdim, seqlen, chunk, D per channel)
CASES = [
    ("bfloat16", 1, 16, 32, 1, 64, False),
    ("float16", 2, 64, 64, 7, 128, True),
    ("float32", 1, 128, 64, 63, 256, False),
    ("bfloat16", 4, 256, 128, 65, 256, True),
    ("float32", 2, 32, 128, 1000, 64, False),
    ("float16", 1, 128, 64, 4097, 256, False),
    ("bfloat16", 2, 64, 96, 2048, 128, True),
    ("bfloat16", 1, 128, 64, 16384, 256, False),
    ("float32", 1, 16, 32, 16384, 128, True),
    ("float16", 1, 256, 32, 300, 64, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_forward_matrix(case: tuple, rule: Any, poison: Any, fwd_path: str) -> None:
    dt_name, g, n, p, L, chunk, D2 = case
    dtype = DTYPES[dt_name]
    b, h = (2, 4) if L <= 4097 else (1, 2)
    a = ssd_inputs(b, L, h, p, g, n, dtype, D2=D2)
    poison(b * L * h * p * a["x"].element_size(), b * h * p * n * 4)
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=chunk, dt_softplus=True, return_final_states=True
    )
    assert out.dtype == dtype and out.shape == a["x"].shape and final.dtype == torch.float32
    check_case(rule, out, final, a, chunk, True)


# Shapes off every tile of cuda/ssd_fwd2.cu: headdim / dstate not multiples of 8 (its element
# path, no cp.async), of 64 / 128 (masked tile tails), seqlen tails inside a 64-row block,
# several groups. (dtype, ngroups, nheads, dstate, headdim, seqlen, chunk, D per channel)
ODD_CASES = [
    ("bfloat16", 2, 4, 20, 33, 300, 64, True),
    ("float16", 1, 2, 130, 70, 517, 128, False),
    ("bfloat16", 2, 6, 136, 40, 1000, 256, True),
    ("float16", 3, 3, 8, 128, 77, 256, False),
    ("bfloat16", 1, 2, 256, 8, 260, 64, False),
    # 12 heads: ssd2_chunk_prep's second 8-head CTA half full
    ("bfloat16", 3, 12, 64, 32, 300, 128, False),
]


@pytest.mark.parametrize("case", ODD_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_forward_odd_shapes(case: tuple, rule: Any, poison: Any, fwd_path: str) -> None:
    dt_name, g, h, n, p, L, chunk, D2 = case
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, L, h, p, g, n, dtype, D2=D2)
    poison(2 * L * h * p * a["x"].element_size(), 2 * h * p * n * 4)
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=chunk, dt_softplus=True, return_final_states=True
    )
    check_case(rule, out, final, a, chunk, True)


@pytest.mark.parametrize("decay", ["steep", "growing"])
@pytest.mark.parametrize("dt_name", ["bfloat16", "float16"])
def test_forward_extreme_decays(
    decay: str, dt_name: str, rule: Any, poison: Any, fwd_path: str
) -> None:
    """Decays far outside the usual range through every 64-row block of a chunk: A ~ -16 (exp of
    the decay underflows a few positions from the diagonal, so the second path's factored decay
    below the diagonal, exp(cum_l - cum_m0) (CB exp(cum_m0 - cum_s) dt'_s), has its factors
    underflow where W does) and A > 0 (cum grows: the factors stay below the product, neither
    overflows; ~3x a chunk here). Both against float64 under the rule, no inf / nan."""
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, 700, 4, 64, 1, 64, dtype)
    a["A"] = (
        -16.0 - torch.rand(4, device="cuda")
        if decay == "steep"
        else 0.01 * torch.rand(4, device="cuda") + 0.002
    )
    poison(2 * 700 * 4 * 64 * a["x"].element_size(), 2 * 4 * 64 * 64 * 4)
    for chunk in (256, 128):
        out, final = flashscan.mamba_chunk_scan_combined(
            **a, chunk_size=chunk, dt_softplus=True, return_final_states=True
        )
        assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(final).all())
        check_case(rule, out, final, a, chunk, True)


# One 64-row block without initial states: ssd2_chunk_scan_one forms its C B^T block itself
# (no ssd2_chunk_cb launch). (dtype, ngroups, nheads, dstate, headdim, seqlen, chunk)
ONE_BLOCK_CASES = [
    ("bfloat16", 1, 8, 64, 64, 60, 256),  # the real-time shape's heads (batch 4 here)
    ("float16", 2, 4, 20, 33, 37, 64),  # element loads: dstate / headdim not multiples of 8
    ("bfloat16", 2, 4, 256, 128, 64, 128),  # 4 dstate steps, 2 channel tiles, a full block
    ("float16", 1, 2, 130, 70, 1, 256),  # one position, a 3-step dstate with a tail
]


def kernels_of(call: Any) -> set[str]:
    """The CUDA kernel names one (already warm) call launches, from a profiler trace."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


def state_kernels(seq_idx: bool, rows16: bool) -> tuple[str, ...]:
    """The second path's chunk-state launches of a call: on sm_90a without seq_idx where x and B
    come in rows of 16-byte multiples (`rows16`: TMA; unless FLASHSCAN_SSD_STATE_PASS=0)
    ssd2_chunk_state_pass, else ssd2_chunk_state + ssd2_state_passing."""
    fused = (
        torch.cuda.get_device_capability() == (9, 0)
        and not seq_idx
        and rows16
        and os.environ.get("FLASHSCAN_SSD_STATE_PASS") != "0"
    )
    if not fused:
        return ("ssd2_chunk_state", "ssd2_state_passing")
    return ("ssd2_chunk_state_pass",)


def bwd_state_kernels(kept: bool = True, seq_idx: bool = False) -> tuple[str, ...]:
    """A 16-bit backward's L_c and reverse state passing: ssd_bwd_dstate_pass on sm_90a for a
    call with the forward's kept H_c (`kept`: flashscan.torch's 16-bit calls without z), no
    seq_idx, rows TMA can address (the tests' dense tensors) and the one-rounding L_c (not
    FLASHSCAN_SSD_DSTATE_HILO=1), unless FLASHSCAN_SSD_BWD_STATE_PASS=0; else
    ssd_bwd_chunk_dstate16 + ssd_bwd_state_passing."""
    fused = (
        torch.cuda.get_device_capability() == (9, 0)
        and kept
        and not seq_idx
        and os.environ.get("FLASHSCAN_SSD_BWD_STATE_PASS") != "0"
        and os.environ.get("FLASHSCAN_SSD_DSTATE_HILO") != "1"
    )
    return (
        ("ssd_bwd_dstate_pass",) if fused else ("ssd_bwd_chunk_dstate16", "ssd_bwd_state_passing")
    )


def warm_forward_kernels(a: dict[str, Any], kw: dict[str, Any]) -> tuple[Any, set[str]]:
    """One forward to compile and warm up, then one more under the profiler: (its result, the
    kernel names it launched)."""
    flashscan.mamba_chunk_scan_combined(**a, **kw)
    res: Any = None

    def call() -> None:
        nonlocal res
        res = flashscan.mamba_chunk_scan_combined(**a, **kw)

    names = kernels_of(call)
    return res, names


@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("case", ONE_BLOCK_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_forward_one_block_fused_cb(
    case: tuple, final: bool, seq: bool, rule: Any, poison: Any, fwd_path: str
) -> None:
    dt_name, g, h, n, p, L, chunk = case
    dtype = DTYPES[dt_name]
    a = ssd_inputs(4, L, h, p, g, n, dtype, D2=True, init=False)
    kw: dict[str, Any] = dict(chunk_size=chunk, dt_softplus=True, return_final_states=final)
    if seq:  # rows 0 / 1 cut at L // 3 and 1; rows 2 / 3 one sequence
        seq_idx = torch.zeros(4, L, dtype=torch.int32, device="cuda")
        seq_idx[0, L // 3 :] = 1
        seq_idx[1, min(1, L - 1) :] = 1
        kw["seq_idx"] = seq_idx
    poison(4 * L * h * p * a["x"].element_size(), 4 * h * p * n * 4)
    res, names = warm_forward_kernels(a, kw)
    if fwd_path == "2":
        assert "ssd2_chunk_scan_one" in names and "ssd2_chunk_cb" not in names, sorted(names)
    out, fin = res if final else (res, None)
    ref_kw = {"seq_idx": kw["seq_idx"].cpu().numpy()} if seq else {}
    ref_y, ref_h = ref64(a, chunk, dt_softplus=True, **ref_kw)
    if seq:
        base_y, base_h = baseline_packed(a, chunk, kw["seq_idx"])
    else:
        base_y, base_h = baseline_lowp(a, chunk, True)
    rule.check(
        out, torch.from_numpy(ref_y), base_y, atol=1e-5 * max(float(np.abs(ref_y).max()), 1.0)
    )
    if final:
        rule.check(fin, torch.from_numpy(ref_h), base_h, atol=1e-5, name="final_states")


# The sm_90a warp-specialised chunk outputs (`ssd2_chunk_scan_ws`, the default for bf16 at chunk
# 256 without z or seq_idx, 16-byte aligned rows; FLASHSCAN_SSD_SCAN_WS=0 keeps ssd2_chunk_scan):
# units in the first chunk with and without initial states and past it, headdim / dstate tails
# that the TMA boxes zero-fill (40, 136 channels; 72 states), two p tiles, several groups, x / B /
# C as views of one wider projection (the Mamba-2 layer's split), and a split whose rows are not
# 16-byte multiples, which falls back to `ssd2_chunk_scan`, as fp16 does (its C B^T would come in
# x's dtype). Both forms: W x waited block by block (the default) and software-pipelined
# (`ssd2_chunk_scan_ws_pipe`, FLASHSCAN_SSD_SCAN_WS_PIPE=1, opt-in until its first GPU run).
# (dtype, ngroups, nheads, dstate, headdim, seqlen, initial states, split: None | pad columns)
WS_CASES = [
    ("bfloat16", 1, 5, 128, 64, 1000, False, None),
    ("float16", 2, 4, 72, 40, 600, True, None),
    ("bfloat16", 1, 3, 64, 136, 513, False, 0),
    ("bfloat16", 2, 2, 64, 64, 300, True, 4),
]


def split_views(a: dict[str, Any], pad: int) -> None:
    """x, B and C replaced by views of one (batch, seqlen, h p + 2 g n + pad) tensor holding the
    same values, as the Mamba-2 layer's split of its projection gives them."""
    x, B, C = a["x"], a["B"], a["C"]
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    wide = torch.zeros(b, L, h * p + 2 * g * n + pad, device="cuda", dtype=x.dtype)
    wide[..., : h * p] = x.reshape(b, L, h * p)
    wide[..., h * p : h * p + g * n] = B.reshape(b, L, g * n)
    wide[..., h * p + g * n : h * p + 2 * g * n] = C.reshape(b, L, g * n)
    a["x"] = wide[..., : h * p].unflatten(-1, (h, p))
    a["B"] = wide[..., h * p : h * p + g * n].unflatten(-1, (g, n))
    a["C"] = wide[..., h * p + g * n : h * p + 2 * g * n].unflatten(-1, (g, n))


@pytest.mark.parametrize("pipe", [False, True], ids=["blockwise", "pipelined"])
@pytest.mark.parametrize("case", WS_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_forward_warp_specialised(
    case: tuple, pipe: bool, rule: Any, poison: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("ssd2_chunk_scan_ws is sm_90a's")
    monkeypatch.delenv("FLASHSCAN_SSD_SCAN_WS", raising=False)  # (the default: on)
    monkeypatch.setenv("FLASHSCAN_SSD_SCAN_WS_PIPE", "1" if pipe else "0")
    kernel, other = "ssd2_chunk_scan_ws", "ssd2_chunk_scan_ws_pipe"
    if pipe:
        kernel, other = other, kernel
    dt_name, g, h, n, p, L, init, split = case
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, L, h, p, g, n, dtype, D2=True, init=init)
    a["z"] = None
    if split is not None:
        split_views(a, split)
    kw: dict[str, Any] = dict(chunk_size=256, dt_softplus=True, return_final_states=True)
    poison(2 * L * h * p * a["x"].element_size(), 2 * h * p * n * 4)
    (out, final), names = warm_forward_kernels(a, kw)
    # bf16 only (its C B^T comes in x's dtype); rows of 16-byte multiples (pad 4 leaves them
    # 8-byte aligned)
    ws = dt_name == "bfloat16" and split in (None, 0)
    assert (kernel in names) == ws and other not in names, sorted(names)
    assert ("ssd2_chunk_scan" in names) == (not ws), sorted(names)
    check_case(rule, out, final, a, 256, True)


# The sm_90a chunk states with the state passing in one kernel (`ssd2_chunk_state_pass`, the default
# for 16-bit calls without seq_idx whose x and B rows TMA can address; FLASHSCAN_SSD_STATE_PASS=0
# keeps ssd2_chunk_state + ssd2_state_passing): H carried through every chunk in one CTA's
# accumulator. Every chunk size, both dtypes, seqlen not a multiple of the chunk (a short last
# chunk, one shorter than a 32-position step), headdim / dstate tails and two tiles each way (40,
# 136 channels; 72, 200 states), one B block (16, 24 states), several groups, with and without
# initial / final states, x / B as views of one projection (the Mamba-2 split; rows 8-byte aligned
# only: no tensor map, the pair runs); the result against the rule, and the kernels launched against
# the switches.
# (dtype, ngroups, nheads, dstate, headdim, seqlen, chunk, initial, final, split: None | pad)
STATE_PASS_CASES = [
    ("bfloat16", 1, 4, 128, 64, 1000, 256, False, True, None),
    ("float16", 2, 8, 72, 40, 600, 128, True, True, None),
    ("bfloat16", 1, 2, 200, 136, 513, 64, True, False, None),
    ("bfloat16", 2, 2, 64, 64, 290, 256, False, False, 0),
    ("float16", 1, 3, 16, 32, 4100, 256, True, True, None),
    ("bfloat16", 2, 8, 24, 64, 333, 64, True, True, None),
    ("bfloat16", 1, 4, 64, 64, 700, 128, True, True, 4),
]


@pytest.mark.parametrize("form", ["single", "pair"])
@pytest.mark.parametrize("case", STATE_PASS_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_forward_fused_state_passing(
    case: tuple, form: str, rule: Any, poison: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("ssd2_chunk_state_pass is sm_90a's")
    monkeypatch.delenv("FLASHSCAN_SSD_STATE_PASS", raising=False)  # (the default: on)
    if form == "pair":
        monkeypatch.setenv("FLASHSCAN_SSD_STATE_PASS", "0")
    dt_name, g, h, n, p, L, chunk, init, final, split = case
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, L, h, p, g, n, dtype, D2=True, init=init)
    if split is not None:
        split_views(a, split)
    kw: dict[str, Any] = dict(chunk_size=chunk, dt_softplus=True, return_final_states=final)
    nchunks = -(-L // chunk)
    # outputs, final states and the states workspace (whose H_c slots the scan reads) NaN
    poison(2 * L * h * p * a["x"].element_size(), 2 * h * p * n * 4, 2 * nchunks * h * p * n * 4)
    res, names = warm_forward_kernels(a, kw)
    # (x and B by TMA: rows of 16-byte multiples)
    every = {"ssd2_chunk_state_pass", "ssd2_chunk_state", "ssd2_state_passing"}
    assert names & every == set(state_kernels(False, split != 4)), sorted(names)
    if final:
        out, fin = res
        check_case(rule, out, fin, a, chunk, True)
    else:
        check_y(rule, res, a, chunk)


def check_y(rule: Any, got: Any, a: dict, chunk: int) -> None:
    """check_case's output half (a call without final states)."""
    ref_y, _ = ref64(a, chunk, dt_softplus=True)
    ref_y_t = torch.from_numpy(ref_y)
    base_y, _ = baseline_lowp(a, chunk, True)
    rule.check(got, ref_y_t, base_y, atol=1e-5 * max(float(ref_y_t.abs().max()), 1.0))


@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("L", [100, 300])
def test_forward_chunked_reads_prep_records(
    L: int, seq: bool, rule: Any, poison: Any, fwd_path: str
) -> None:
    """Past one 64-row block the second path runs ssd2_chunk_prep once per (batch, head, chunk)
    and the scan (and, with several chunks, the state kernels) read its records instead of
    forming the prologue themselves: the kernel names of one warm call, and its output, for one
    chunk (no carried state: the scan waits on the record itself) and three, with seq_idx cuts
    (masked blocks) and without (blocks below the diagonal unmasked)."""
    a = ssd_inputs(2, L, 3, 64, 1, 48, torch.bfloat16, D2=True, init=False)
    kw: dict[str, Any] = dict(chunk_size=128, dt_softplus=True)
    if seq:
        seq_idx = torch.zeros(2, L, dtype=torch.int32, device="cuda")
        seq_idx[0, L // 3 :] = 1
        seq_idx[0, L // 2 :] = 2
        kw["seq_idx"] = seq_idx
    poison(2 * L * 3 * 64 * 2, 2 * 3 * 64 * 48 * 4)
    res, names = warm_forward_kernels(a, kw)
    if fwd_path == "2":
        want = {"ssd2_chunk_prep", "ssd2_chunk_cb", "ssd2_chunk_scan"}
        if L > 128:
            want |= set(state_kernels(seq, True))
        assert want <= names and "ssd2_chunk_scan_one" not in names, sorted(names)
    ref_kw = {"seq_idx": kw["seq_idx"].cpu().numpy()} if seq else {}
    ref_y, _ = ref64(a, 128, dt_softplus=True, **ref_kw)
    if seq:
        base_y, _ = baseline_packed(a, 128, kw["seq_idx"])
    else:
        base_y, _ = baseline_lowp(a, 128, True)
    rule.check(
        res, torch.from_numpy(ref_y), base_y, atol=1e-5 * max(float(np.abs(ref_y).max()), 1.0)
    )


@pytest.mark.parametrize("switch", [None, "2"])
def test_fwd2_family_is_built(monkeypatch: pytest.MonkeyPatch, switch: str | None) -> None:
    """16-bit data really runs cuda/ssd_fwd2.cu, by default and under FLASHSCAN_SSD_FWD=2: its
    family's CUBIN is in the kernel cache after a call (the cache is on in the test runs:
    tools/gpu_check.sh)."""
    from pathlib import Path

    from flashscan import _native

    if switch is None:
        monkeypatch.delenv("FLASHSCAN_SSD_FWD", raising=False)
    else:
        monkeypatch.setenv("FLASHSCAN_SSD_FWD", switch)
    a = ssd_inputs(1, 100, 2, 64, 1, 64, torch.bfloat16)
    flashscan.mamba_chunk_scan_combined(**a, chunk_size=64, dt_softplus=True)
    torch.cuda.synchronize()
    built = list(Path(_native.cache_dir()).glob("ssd_fwd2-*.cubin"))
    assert built, f"no ssd_fwd2 CUBIN in {_native.cache_dir()}"


def test_chunk_sizes_agree_and_optionals_absent(rule: Any) -> None:
    a = ssd_inputs(2, 700, 4, 64, 1, 64, torch.float32, init=False)
    bare = {k: a[k] for k in ("x", "dt", "A", "B", "C")}
    bare["dt"] = F.softplus(bare["dt"])
    host = {k: v.double().cpu().numpy() for k, v in bare.items()}
    want = reference_ssd.mamba_chunk_scan_combined(**host, chunk_size=256)
    for chunk in (64, 128, 256):
        out = flashscan.mamba_chunk_scan_combined(**bare, chunk_size=chunk)
        rule.rel(out, torch.from_numpy(want), FP32_RTOL, atol=1e-6, name=f"chunk {chunk}")


def baseline_packed(a: dict[str, Any], chunk: int, seq_idx: Any) -> tuple[Any, Any]:
    """`baseline_lowp` for packed sequences: each batch row cut where seq_idx changes, each
    piece run alone from a zero state (the first from the initial state when its id is 0)."""
    outs, finals = [], []
    for r in range(seq_idx.shape[0]):
        ids = seq_idx[r].tolist()
        starts = [0] + [t for t in range(1, len(ids)) if ids[t] != ids[t - 1]] + [len(ids)]
        pieces, H = [], None
        for lo, hi in zip(starts[:-1], starts[1:]):
            part = {
                k: (v[r : r + 1, lo:hi] if k in ("x", "dt", "B", "C", "z") else v)
                for k, v in a.items()
            }
            init = a["initial_states"]
            part["initial_states"] = (
                init[r : r + 1] if lo == 0 and ids[0] == 0 and init is not None else None
            )
            y, H = baseline_lowp(part, chunk, True)
            pieces.append(y)
        outs.append(torch.cat(pieces, dim=1))
        finals.append(H)
    return torch.cat(outs), torch.cat(finals)


@pytest.mark.parametrize("dt_name", ["float32", "bfloat16"])
def test_seq_idx_resets(dt_name: str, rule: Any, fwd_path: str) -> None:
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, 600, 4, 64, 2, 64, dtype)
    cuts = torch.tensor([0, 1, 1, 5, 200, 256, 257, 511], device="cuda")
    seq_idx = (torch.arange(600, device="cuda")[:, None] >= cuts).sum(-1).to(torch.int32) - 1
    seq_idx = torch.stack([seq_idx, torch.zeros_like(seq_idx)])
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=256, seq_idx=seq_idx, dt_softplus=True, return_final_states=True
    )
    ref_y, ref_h = ref64(a, 256, dt_softplus=True, seq_idx=seq_idx.cpu().numpy())
    if dtype == torch.float32:
        rule.rel(out, torch.from_numpy(ref_y), FP32_RTOL, atol=1e-6)
        rule.rel(final, torch.from_numpy(ref_h), FP32_RTOL, atol=1e-6, name="final_states")
        return
    base_y, base_h = baseline_packed(a, 256, seq_idx)
    rule.check(
        out, torch.from_numpy(ref_y), base_y, atol=1e-5 * max(float(np.abs(ref_y).max()), 1.0)
    )
    rule.check(final, torch.from_numpy(ref_h), base_h, atol=1e-5, name="final_states")


def test_dt_limit_and_int64_seq_idx(rule: Any) -> None:
    a = ssd_inputs(1, 130, 2, 32, 1, 16, torch.float32)
    seq_idx = torch.zeros(1, 130, dtype=torch.int64, device="cuda")
    seq_idx[:, 70:] = 1
    out = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=64, seq_idx=seq_idx, dt_softplus=True, dt_limit=(0.2, 0.3)
    )
    ref_y, _ = ref64(a, 64, dt_softplus=True, dt_limit=(0.2, 0.3), seq_idx=seq_idx.cpu().numpy())
    rule.rel(out, torch.from_numpy(ref_y), FP32_RTOL, atol=1e-6)


def test_strided_inputs_like_mamba2_split(rule: Any, fwd_path: str) -> None:
    """x, B, C (and z) as views of one projection, as Mamba-2 splits zxbcdt: last dim contiguous,
    other strides not."""
    b, L, h, p, g, n = 2, 300, 4, 64, 1, 64
    proj = torch.randn(b, L, 2 * h * p + 2 * g * n + h, device="cuda").to(torch.bfloat16)
    z, x, B, C, dt = torch.split(proj, [h * p, h * p, g * n, g * n, h], dim=-1)
    a = {
        "x": x.reshape(b, L, h, p),
        "z": z.reshape(b, L, h, p),
        "B": B.reshape(b, L, g, n) * 0.3,
        "C": C.reshape(b, L, g, n),
        "dt": dt,
        "A": -torch.rand(h, device="cuda") - 0.5,
        "D": torch.randn(h, device="cuda"),
        "dt_bias": torch.rand(h, device="cuda"),
        "initial_states": None,
    }
    a["B"] = a["B"].contiguous()[:, :, :, :]  # one contiguous, one strided (C)
    assert not a["x"].is_contiguous() and not a["C"].is_contiguous()
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=128, dt_softplus=True, return_final_states=True
    )
    dense = {k: None if v is None else v.contiguous() for k, v in a.items()}
    check_case(rule, out, final, dense, 128, True)


def test_streaming_with_initial_states_equals_one_call(rule: Any) -> None:
    a = ssd_inputs(2, 777, 4, 64, 2, 128, torch.float32)
    whole, h_whole = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=256, dt_softplus=True, return_final_states=True
    )
    h = a["initial_states"]
    outs = []
    for lo, hi in ((0, 300), (300, 301), (301, 777)):
        part = {k: (v[:, lo:hi] if k in ("x", "dt", "B", "C", "z") else v) for k, v in a.items()}
        part["initial_states"] = h
        o, h = flashscan.mamba_chunk_scan_combined(
            **part, chunk_size=256, dt_softplus=True, return_final_states=True
        )
        outs.append(o)
    rule.rel(torch.cat(outs, dim=1), whole, 1e-4, atol=1e-6)
    rule.rel(h, h_whole, 1e-4, atol=1e-6, name="final_states")


def test_cuda_graph_capture_and_replay(rule: Any, fwd_path: str) -> None:
    a = ssd_inputs(32, 60, 8, 64, 1, 64, torch.bfloat16)  # the small real-time shape
    kw = dict(chunk_size=256, dt_softplus=True, return_final_states=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashscan.mamba_chunk_scan_combined(**a, **kw)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, final = flashscan.mamba_chunk_scan_combined(**a, **kw)
    for _step in range(2):
        fresh = ssd_inputs(32, 60, 8, 64, 1, 64, torch.bfloat16)
        for k in ("x", "dt", "B", "C", "z", "initial_states"):
            a[k].copy_(fresh[k])
        out.fill_(float("nan"))
        final.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_case(rule, out, final, a, 256, True)


FIRST_SCRATCH_IN_CAPTURE = """
import torch, flashscan
torch.manual_seed(0)
b, L, h, p, n = 4, 60, 8, 64, 64
x = torch.randn(b, L, h, p, device="cuda", dtype=torch.bfloat16)
dt = torch.rand(b, L, h, device="cuda") - 1.5
A = -torch.rand(h, device="cuda") - 0.2
B = (torch.randn(b, L, 1, n, device="cuda") * 0.3).to(torch.bfloat16)
C = (torch.randn(b, L, 1, n, device="cuda") * 0.3).to(torch.bfloat16)
kw = dict(initial_states=torch.randn(b, h, p, n, device="cuda"), dt_softplus=True,
          return_final_states=True)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    want, want_f = flashscan.mamba_chunk_scan_combined(x, dt, A, B, C, 256, **kw)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out, fin = flashscan.mamba_chunk_scan_combined(x, dt, A, B, C, 256, **kw)
out.fill_(float("nan"))
fin.fill_(float("nan"))
g.replay()
torch.cuda.synchronize()
assert torch.equal(out, want) and torch.equal(fin, want_f)
print("ok")
"""


def test_first_scratch_use_inside_a_capture() -> None:
    """A process whose first scratch allocation is captured: a warm-up on the first forward path
    (no scratch: torch allocates its workspaces), then the planned call, whose workspaces come
    from the scratch pool, inside torch.cuda.graph. Capture and replay work and match the warm-up
    (the pool was made lazily, and torch's global-mode capture refused cuMemPoolCreate: found
    when test_cuda_graph_capture_and_replay first ran in a fresh pytest worker, 2026-11-28)."""
    env = {**os.environ, "FLASHSCAN_SSD_FWD": "1"}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIRST_SCRATCH_IN_CAPTURE)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_gpu_errors_are_clear() -> None:
    a = ssd_inputs(1, 64, 2, 32, 1, 16, torch.bfloat16)
    with pytest.raises(flashscan.UnsupportedError, match="chunk_size"):
        flashscan.mamba_chunk_scan_combined(**a, chunk_size=100)
    with pytest.raises(flashscan.UnsupportedError, match="return_varlen_states"):
        flashscan.mamba_chunk_scan_combined(  # float32 x: no GPU varlen states
            **{**a, "x": a["x"].float(), "B": a["B"].float(), "C": a["C"].float(),
               "z": a["z"].float()},
            chunk_size=64, cu_seqlens=torch.tensor([0, 64], device="cuda"),
            return_varlen_states=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match="seq_idx must change exactly"):
        flashscan.mamba_chunk_scan_combined(  # two sequences, no seq_idx to reset the state
            **a, chunk_size=64, cu_seqlens=torch.tensor([0, 30, 64], device="cuda"),
            return_varlen_states=True,
        )  # fmt: skip
    with pytest.raises(flashscan.UnsupportedError, match="B is float32"):
        flashscan.mamba_chunk_scan_combined(
            **{**a, "B": a["B"].float(), "C": a["C"].float()}, chunk_size=64
        )
    with pytest.raises(ValueError, match="mixing CPU and GPU"):
        flashscan.mamba_chunk_scan_combined(**{**a, "A": a["A"].cpu()}, chunk_size=64)
    leaf = a["x"].clone().requires_grad_(True)
    out = flashscan.mamba_chunk_scan_combined(**{**a, "x": leaf}, chunk_size=64)
    out.float().sum().backward()  # the backward kernels (no UnsupportedError any more)
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


def test_float64_cuda_runs_the_reference(rule: Any) -> None:
    """float64 CUDA tensors (gradcheck's) run the reference through the torch adapter; the
    public function takes the kernels' dtypes only, as every flashscan op."""
    import flashscan.torch as fst

    a = ssd_inputs(1, 33, 2, 8, 1, 4, torch.float64)
    with pytest.raises(TypeError, match="float64"):
        flashscan.mamba_chunk_scan_combined(**a, chunk_size=16, dt_softplus=True)
    out = fst.mamba_chunk_scan_combined(**a, chunk_size=16, dt_softplus=True)
    assert out.is_cuda and out.dtype == torch.float64
    ref_y, _ = ref64(a, 16, dt_softplus=True)
    rule.rel(out, torch.from_numpy(ref_y), 1e-12, atol=1e-12)


def test_prefill_then_state_update_step_equals_one_scan(rule: Any) -> None:
    """Mamba-2 serving: SSD prefill (final states) then one selective_state_update step (the
    Mamba-2 layout, broadcast strides) == the SSD scan over the prefill plus that token."""
    b, L, h, p, g, n = 2, 301, 8, 64, 2, 128
    a = ssd_inputs(b, L + 1, h, p, g, n, torch.float32, init=False)
    whole, fin_whole = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=256, dt_softplus=True, return_final_states=True
    )
    pre = {k: (v[:, :L] if k in ("x", "dt", "B", "C", "z") else v) for k, v in a.items()}
    _, state = flashscan.mamba_chunk_scan_combined(
        **pre, chunk_size=256, dt_softplus=True, return_final_states=True
    )
    out = flashscan.selective_state_update(
        state, a["x"][:, L], a["dt"][:, L, :, None].expand(b, h, p),
        a["A"][:, None, None].expand(h, p, n), a["B"][:, L], a["C"][:, L],
        D=a["D"][:, None].expand(h, p), z=a["z"][:, L],
        dt_bias=a["dt_bias"][:, None].expand(h, p), dt_softplus=True,
    )  # fmt: skip
    rule.rel(out, whole[:, L], FP32_RTOL, atol=1e-6, name="decode step")
    rule.rel(state, fin_whole, FP32_RTOL, atol=1e-6, name="state")


def test_hot_path_serves_a_repeated_signature(rule: Any, fwd_path: str) -> None:
    """The second call of a signature takes the plan (no checks) and gives the same bits;
    final states only when asked."""
    from flashscan import ssd

    a = ssd_inputs(4, 60, 8, 64, 1, 64, torch.bfloat16)
    first = flashscan.mamba_chunk_scan_combined(**a, chunk_size=256, dt_softplus=True)
    n = len(ssd._PLANS)
    second = flashscan.mamba_chunk_scan_combined(**a, chunk_size=256, dt_softplus=True)
    assert len(ssd._PLANS) == n and n >= 1
    assert isinstance(second, torch.Tensor) and torch.equal(first, second)
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=256, dt_softplus=True, return_final_states=True
    )
    out2, final2 = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=256, dt_softplus=True, return_final_states=True
    )
    assert torch.equal(out, first) and torch.equal(out2, out) and torch.equal(final2, final)
    check_case(rule, out2, final2, a, 256, True)


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------

GRAD_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
# Half an ulp of the gradient's storage dtype, relative to the largest reference element.
GRAD_RTOL = {torch.float32: 1e-4, torch.float16: 5e-4, torch.bfloat16: 4e-3}
# Per-head gradients summed over batch, time, headdim and dstate (float32 runs): their rounding
# grows with the summed terms, not with the result (the scan backward's SUM_RTOL). Measured on
# the H100: ddt_bias 1.6e-4 of max|ref| at seqlen 700, chunk 256 (2.1e-3 on 13.0).
SUMMED = ("A", "dt_bias", "D")
SUM_RTOL_F32 = 1e-3


@pytest.fixture(params=["1", "2"], ids=["bwd1", "bwd2"])
def bwd_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a backward test under both SSD backward paths, each named explicitly:
    FLASHSCAN_SSD_BWD=1 (dC / dB per head in chunk_dc / chunk_db) and 2 (cuda/ssd_bwd.cu
    section 8: CB and a head-summed dCB once per group, tf32 operands for 16-bit data)."""
    monkeypatch.setenv("FLASHSCAN_SSD_BWD", request.param)
    return request.param


def leaves(a: dict[str, Any]) -> dict[str, Any]:
    return {k: None if v is None else v.detach().clone().requires_grad_(True) for k, v in a.items()}


def grads_of(fn: Any, a: dict[str, Any], dout: Any, dfinal: Any) -> dict[str, Any]:
    """Every present input's gradient of <out, dout> + <final, dfinal> through fn(leaves)."""
    lv = leaves(a)
    out, final = fn(lv)
    outs, gos = [out], [dout.to(out.dtype)]
    if dfinal is not None:
        outs.append(final)
        gos.append(dfinal)
    names = [k for k in GRAD_NAMES if lv.get(k) is not None]
    gs = torch.autograd.grad(outs, [lv[k] for k in names], gos)
    return dict(zip(names, gs))


def ours(a: dict[str, Any], chunk: int, **kw: Any) -> Any:
    import flashscan.torch as fst

    return lambda lv: fst.mamba_chunk_scan_combined(
        **lv, chunk_size=chunk, dt_softplus=True, return_final_states=True, **kw
    )


def ref_grads(a: dict[str, Any], chunk: int, dout: Any, dfinal: Any, **kw: Any) -> dict:
    host = {k: None if v is None else v.detach().double().cpu().numpy() for k, v in a.items()}
    g = reference_ssd.mamba_chunk_scan_combined_bwd(
        dout.double().cpu().numpy(), host["x"], host["dt"], host["A"], host["B"], host["C"],
        chunk, D=host.get("D"), z=host.get("z"), dt_bias=host.get("dt_bias"),
        initial_states=host.get("initial_states"), dt_softplus=True,
        dfinal_states=None if dfinal is None else dfinal.double().cpu().numpy(), **kw,
    )  # fmt: skip
    return {k: torch.from_numpy(v) for k, v in zip(GRAD_NAMES, g) if v is not None}


def check_grads(rule: Any, got: dict, ref: dict, base: dict | None, dtype: Any) -> None:
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    for k in ref:
        assert got[k].shape == ref[k].shape, k
        if base is None:
            rtol = SUM_RTOL_F32 if k in SUMMED and dtype == torch.float32 else GRAD_RTOL[dtype]
            rule.rel(got[k], ref[k], rtol, atol=1e-6, name=f"d{k}")
        else:
            rule.check(got[k], ref[k], base[k], atol=1e-6, rtol=GRAD_RTOL[dtype], name=f"d{k}")


def upstream(a: dict[str, Any], final: bool = True) -> tuple[Any, Any]:
    x = a["x"]
    b, _, h, p = x.shape
    n = a["B"].shape[-1]
    dout = torch.randn(x.shape, device=x.device).to(x.dtype)
    dfinal = torch.randn(b, h, p, n, device=x.device) if final else None
    return dout, dfinal


# (dtype, ngroups, dstate, headdim, seqlen, chunk, D per channel)
BWD_CASES = [
    ("float32", 1, 16, 64, 1, 64, False),
    ("bfloat16", 2, 64, 48, 100, 64, True),
    ("float16", 1, 128, 64, 1000, 256, False),
    ("float32", 2, 128, 48, 1000, 128, True),
    ("bfloat16", 1, 16, 64, 1000, 128, False),
    ("float16", 2, 64, 64, 100, 256, True),
    ("bfloat16", 1, 128, 128, 300, 256, False),
    ("float32", 1, 256, 256, 130, 64, False),
    ("bfloat16", 2, 64, 64, 1, 256, False),
    # rows not a multiple of 4: element loads on path 2; 17 x 30 states a head, not a multiple
    # of 4: the reverse state passing's one-element threads
    ("float16", 2, 17, 30, 77, 64, True),
]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_backward_matrix(case: tuple, rule: Any, poison: Any, bwd_path: str) -> None:
    dt_name, g, n, p, L, chunk, D2 = case
    dtype = DTYPES[dt_name]
    b, h = 2, 4
    a = ssd_inputs(b, L, h, p, g, n, dtype, D2=D2)
    dout, dfinal = upstream(a)
    ref = ref_grads(a, chunk, dout, dfinal)
    base = grads_of(lambda lv: baseline_lowp(lv, chunk, True), a, dout, dfinal)
    poison(b * L * h * p * a["x"].element_size(), b * L * g * n * a["B"].element_size())
    got = grads_of(ours(a, chunk), a, dout, dfinal)
    for k, v in got.items():
        assert v.dtype == a[k].dtype, k
    check_grads(rule, got, ref, base, dtype)


@pytest.mark.parametrize("pdt", ["bfloat16", "float16"])
@pytest.mark.parametrize("D2", [False, True])
def test_small_parameters_in_16_bit(pdt: str, D2: bool, rule: Any, bwd_path: str) -> None:
    """dt, A, D and dt_bias in a 16-bit dtype of their own (the kernels read them by run-time dtype
    codes: the chunk prologues' and ssd_bwd_dt's dt loads, the epilogues' D loads), bf16 data;
    forward and every gradient against float64 under the rule."""
    dtype = torch.bfloat16
    a = ssd_inputs(2, 300, 4, 64, 1, 64, dtype, D2=D2)
    for k in ("dt", "A", "D", "dt_bias"):
        a[k] = a[k].to(DTYPES[pdt])
    out, final = flashscan.mamba_chunk_scan_combined(
        **a, chunk_size=128, dt_softplus=True, return_final_states=True
    )
    ref_y, ref_h = ref64(a, 128, dt_softplus=True)
    base_y, base_h = baseline_lowp(a, 128, True)
    scale = max(float(np.abs(ref_y).max()), 1.0)
    rule.check(out, torch.from_numpy(ref_y), base_y, atol=1e-5 * scale)
    rule.check(final, torch.from_numpy(ref_h), base_h, atol=1e-5, name="final_states")
    dout, dfinal = upstream(a)
    ref = ref_grads(a, 128, dout, dfinal)
    base = grads_of(lambda lv: baseline_lowp(lv, 128, True), a, dout, dfinal)
    got = grads_of(ours(a, 128), a, dout, dfinal)
    for k, v in got.items():
        assert v.dtype == a[k].dtype, k
    check_grads(rule, got, ref, base, dtype)


@pytest.mark.parametrize("dt_name", ["float32", "bfloat16"])
def test_backward_seq_idx_resets(dt_name: str, rule: Any, bwd_path: str) -> None:
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, 600, 4, 64, 2, 64, dtype)
    cuts = torch.tensor([0, 1, 1, 5, 200, 256, 257, 511], device="cuda")
    seq_idx = (torch.arange(600, device="cuda")[:, None] >= cuts).sum(-1).to(torch.int32) - 1
    seq_idx = torch.stack([seq_idx, torch.zeros_like(seq_idx)])
    dout, dfinal = upstream(a)
    ref = ref_grads(a, 128, dout, dfinal, seq_idx=seq_idx.cpu().numpy())
    base = grads_of(lambda lv: baseline_packed(lv, 128, seq_idx), a, dout, dfinal)
    got = grads_of(ours(a, 128, seq_idx=seq_idx), a, dout, dfinal)
    check_grads(rule, got, ref, base, dtype)


def test_backward_without_optionals_and_dfinal(rule: Any, bwd_path: str) -> None:
    """No D, z, dt_bias, initial_states; final states unused (dfinal None); int64 seq_idx and
    a dt_limit clamp (no gradient where clamped)."""
    a = ssd_inputs(2, 333, 4, 64, 1, 64, torch.float32, init=False)
    bare = {k: a[k] for k in ("x", "dt", "A", "B", "C")}
    seq_idx = torch.zeros(2, 333, dtype=torch.int64, device="cuda")
    seq_idx[:, 150:] = 1
    limit = (0.1, 0.3)
    dout, _ = upstream(bare)
    ref = ref_grads(bare, 128, dout, None, seq_idx=seq_idx.cpu().numpy(), dt_limit=limit)
    got = grads_of(ours(bare, 128, seq_idx=seq_idx, dt_limit=limit), bare, dout, None)
    check_grads(rule, got, ref, None, torch.float32)
    assert bool((ref["dt"] == 0).any()), "the clamp should cut some dt gradients"


@pytest.mark.parametrize("dt_name", ["bfloat16", "float16", "float32"])
def test_backward_without_z(dt_name: str, rule: Any, poison: Any, bwd_path: str) -> None:
    """The Mamba-2 layer's call (D per head, no z: its gate is in the RMSNorm after): the
    second path then runs no chunk_out2 (dD from chunk_dx2); a tail chunk of one row block,
    three chunks, initial and final states."""
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, 2 * 256 + 37, 4, 64, 1, 128, dtype)
    del a["z"]
    dout, dfinal = upstream(a)
    ref = ref_grads(a, 256, dout, dfinal)
    base = grads_of(lambda lv: baseline_lowp(lv, 256, True), a, dout, dfinal)
    poison(2 * 549 * 4 * 64 * a["x"].element_size(), 2 * 549 * 128 * a["B"].element_size())
    got = grads_of(ours(a, 256), a, dout, dfinal)
    check_grads(rule, got, ref, base, dtype)


@pytest.mark.parametrize("with_z", [False, True])
def test_backward_twelve_heads(with_z: bool, rule: Any, poison: Any, bwd_path: str) -> None:
    """12 heads in 3 groups: the chunk prologues' second 8-head CTA (ssd2_chunk_prep,
    ssd_bwd_prologue) is half full; bf16 on the 16-bit kernels (no z) and on float32 copies (z)."""
    a = ssd_inputs(2, 300, 12, 32, 3, 32, torch.bfloat16)
    if not with_z:
        del a["z"]
    dout, dfinal = upstream(a)
    ref = ref_grads(a, 128, dout, dfinal)
    base = grads_of(lambda lv: baseline_lowp(lv, 128, True), a, dout, dfinal)
    poison(2 * 300 * 12 * 32 * 2, 2 * 300 * 3 * 32 * 2)
    got = grads_of(ours(a, 128), a, dout, dfinal)
    check_grads(rule, got, ref, base, torch.bfloat16)


def test_backward_without_z_runs_no_chunk_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    a = ssd_inputs(1, 300, 4, 64, 1, 64, torch.bfloat16)
    del a["z"]
    dout, dfinal = upstream(a)
    grads_of(ours(a, 128), a, dout, dfinal)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grads_of(ours(a, 128), a, dout, dfinal)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    assert "ssd_bwd_chunk_dx16" in names and "ssd_bwd_dcb16" in names, sorted(names)
    assert not {"ssd_bwd_chunk_out2", "ssd_bwd_chunk_out"} & names, sorted(names)


@pytest.mark.parametrize("chunk", [64, 128, 256])
def test_backward_chunk_sizes_agree(chunk: int, rule: Any, bwd_path: str) -> None:
    a = ssd_inputs(1, 700, 4, 64, 2, 64, torch.float32)
    dout, dfinal = upstream(a)
    ref = ref_grads(a, 256, dout, dfinal)
    got = grads_of(ours(a, chunk), a, dout, dfinal)
    check_grads(rule, got, ref, None, torch.float32)


def test_backward_is_deterministic(bwd_path: str) -> None:
    a = ssd_inputs(2, 1000, 8, 64, 2, 128, torch.bfloat16)
    dout, dfinal = upstream(a)
    first = grads_of(ours(a, 256), a, dout, dfinal)
    second = grads_of(ours(a, 256), a, dout, dfinal)
    for k in first:
        assert torch.equal(first[k], second[k]), k


@pytest.mark.parametrize("switch", [None, "1", "2"])
def test_backward_path_switch_selects_kernels(
    monkeypatch: pytest.MonkeyPatch, switch: str | None
) -> None:
    """The second path's kernels run by default and under FLASHSCAN_SSD_BWD=2 (and not
    chunk_dc / chunk_db), the first's under 1: the kernel names in a profiler trace of one
    backward."""
    from torch.profiler import ProfilerActivity, profile

    if switch is None:
        monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    else:
        monkeypatch.setenv("FLASHSCAN_SSD_BWD", switch)
    a = ssd_inputs(1, 300, 4, 64, 1, 64, torch.bfloat16)
    dout, dfinal = upstream(a)
    grads_of(ours(a, 128), a, dout, dfinal)  # compiled and warm
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grads_of(ours(a, 128), a, dout, dfinal)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    second = {"ssd_bwd_cb", "ssd_bwd_dcb", "ssd_bwd_chunk_dc2", "ssd_bwd_chunk_db2"}
    second |= {"ssd_bwd_chunk_out2", "ssd_bwd_chunk_dx2"}  # the call has z: out2, fp32 dx / dCB
    first = {"ssd_bwd_chunk_dc", "ssd_bwd_chunk_db", "ssd_bwd_chunk_out"}
    want, unwanted = (first, second) if switch == "1" else (second, first)
    assert want <= names, sorted(n for n in names if n.startswith("ssd"))
    assert not (unwanted & names), sorted(unwanted & names)


def _bwd_kernel_names(a: dict[str, Any], chunk: int, **kw: Any) -> set[str]:
    """The CUDA kernels of one (warm) forward + backward through flashscan.torch."""
    from torch.profiler import ProfilerActivity, profile

    dout, dfinal = upstream(a)
    grads_of(ours(a, chunk, **kw), a, dout, dfinal)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grads_of(ours(a, chunk, **kw), a, dout, dfinal)
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("dt_name", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("switch", [None, "0"])
@pytest.mark.parametrize("with_z", [False, True], ids=["noz", "z"])
def test_backward_16bit_kernels_run_on_16bit_data(
    monkeypatch: pytest.MonkeyPatch, dt_name: str, switch: str | None, with_z: bool
) -> None:
    """A 16-bit call without z recomputes its chunk states on ssd2's kernels and takes dx, dCB,
    dC, dB and L_c from the 16-bit kernels on its own 16-bit tensors (every gradient written
    in its dtype: no float32 copies, no casts back), not from the float32 ones on float32
    copies; FLASHSCAN_SSD_DX16=0, a call with z and float32 data take the float32 kernels."""
    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DSTATE_HILO", raising=False)
    if switch is None:
        monkeypatch.delenv("FLASHSCAN_SSD_DX16", raising=False)
    else:
        monkeypatch.setenv("FLASHSCAN_SSD_DX16", switch)
    a = ssd_inputs(1, 300, 4, 64, 1, 64, DTYPES[dt_name])
    if not with_z:
        del a["z"]
    names = _bwd_kernel_names(a, 128)
    want16 = switch is None and dt_name != "float32" and not with_z
    assert ("ssd_bwd_chunk_dx16" in names) == want16, sorted(n for n in names if "dx" in n)
    assert ("ssd_bwd_chunk_dx2" in names) == (not want16), sorted(n for n in names if "dx" in n)
    assert ("ssd_bwd_dcb16" in names) == want16, sorted(n for n in names if "dcb" in n)
    assert ("ssd_bwd_dcb" in names) == (not want16), sorted(n for n in names if "dcb" in n)
    for k in ("dc", "db"):
        assert (f"ssd_bwd_chunk_{k}16" in names) == want16, sorted(n for n in names if k in n)
        assert (f"ssd_bwd_chunk_{k}2" in names) == (not want16), sorted(n for n in names if k in n)
    # the recompute of the chunk states: ssd2's kernels (the 16-bit forward runs them too), the
    # first path's only without the 16-bit tensors; L_c and C B^T alike
    assert ("ssd_chunk_state" in names) == (not want16), sorted(n for n in names if "state" in n)
    dstate = sorted(n for n in names if "dstate" in n)
    want_l = set(bwd_state_kernels()) if want16 else set()
    for name in ("ssd_bwd_chunk_dstate16", "ssd_bwd_dstate_pass"):
        assert (name in names) == (name in want_l), dstate
    assert ("ssd_bwd_chunk_dstate" in names) == (not want16), dstate
    assert "ssd_bwd_chunk_dstate16_hilo" not in names, dstate
    if want16:  # the hi / lo split of L_c's scaled dout only where asked for
        monkeypatch.setenv("FLASHSCAN_SSD_DSTATE_HILO", "1")
        split = sorted(n for n in _bwd_kernel_names(a, 128) if "dstate" in n)
        assert split == ["ssd_bwd_chunk_dstate16_hilo"], split
    assert ("ssd_bwd_cb" in names) == (not want16), sorted(n for n in names if "cb" in n)


# (dtype, ngroups, dstate, headdim, seqlen, chunk, seq_idx cuts or None)
DX16_CASES = [
    ("bfloat16", 1, 128, 64, 2 * 256 + 37, 256, None),  # the layer's shape class, a tail block
    ("float16", 2, 64, 128, 1000, 128, None),  # two channel tiles, ngroups 2
    ("bfloat16", 1, 16, 64, 64, 64, None),  # one chunk of one block (dS = dfinal)
    ("float16", 1, 64, 64, 600, 256, (0, 1, 5, 200, 256, 300, 511)),  # masked upper blocks
    # dstate 21 / headdim 42: element dS rows, odd tiles, one-element state passing threads
    ("bfloat16", 2, 21, 42, 333, 64, None),
]


@pytest.mark.parametrize("case", DX16_CASES, ids=lambda c: "-".join(str(v) for v in c[:6]))
def test_backward_16bit_kernels_match_the_rule(
    case: tuple, rule: Any, poison: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every gradient of a 16-bit call without z (the states recomputed on ssd2's kernels; dx,
    dCB, dC, dB and the partials behind ddt, dA, ddt_bias, dD from the 16-bit kernels) against
    float64 under the rule, beside the float32 kernels' (FLASHSCAN_SSD_DX16=0) within the same
    rule: final states, initial states, D per channel, seq_idx resets, NaN-poisoned scratch. L_c
    both ways: its scaled dout rounded once (the default) and split into a hi / lo pair
    (FLASHSCAN_SSD_DSTATE_HILO=1)."""
    dt_name, g, n, p, L, chunk, cuts = case
    dtype = DTYPES[dt_name]
    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DSTATE_HILO", raising=False)
    a = ssd_inputs(2, L, 4, p, g, n, dtype, D2=True)
    del a["z"]  # the 16-bit kernels' calls (with z the float32 ones run)
    kw: dict[str, Any] = {}
    if cuts is not None:
        starts = torch.tensor(cuts, device="cuda")
        seq_idx = (torch.arange(L, device="cuda")[:, None] >= starts).sum(-1) - 1
        seq_idx = torch.stack([seq_idx, torch.zeros_like(seq_idx)]).to(torch.int32)
        kw["seq_idx"] = seq_idx
    dout, dfinal = upstream(a)
    ref = ref_grads(a, chunk, dout, dfinal, **{k: v.cpu().numpy() for k, v in kw.items()})
    if cuts is None:
        base = grads_of(lambda lv: baseline_lowp(lv, chunk, True), a, dout, dfinal)
    else:
        base = grads_of(lambda lv: baseline_packed(lv, chunk, kw["seq_idx"]), a, dout, dfinal)
    size = 2 * L * 4 * p * a["x"].element_size()
    poison(size, 2 * L * g * n * a["B"].element_size())
    got = grads_of(ours(a, chunk, **kw), a, dout, dfinal)
    check_grads(rule, got, ref, base, dtype)
    monkeypatch.setenv("FLASHSCAN_SSD_DSTATE_HILO", "1")
    split = grads_of(ours(a, chunk, **kw), a, dout, dfinal)
    check_grads(rule, split, ref, base, dtype)
    monkeypatch.delenv("FLASHSCAN_SSD_DSTATE_HILO")
    monkeypatch.setenv("FLASHSCAN_SSD_DX16", "0")
    old = grads_of(ours(a, chunk, **kw), a, dout, dfinal)
    check_grads(rule, old, ref, base, dtype)


# (dtype, ngroups, nheads, dstate, headdim, seqlen, chunk, initial states, dfinal_states)
BWD_STATE_PASS_CASES = [
    ("bfloat16", 1, 4, 128, 64, 2 * 256 + 37, 256, True, True),  # the layer's tile, a tail
    ("float16", 2, 4, 64, 64, 1000, 128, False, True),  # two groups, C's first box only
    ("bfloat16", 1, 2, 200, 136, 333, 64, True, False),  # 3 x 2 tiles, last ones partial
    ("bfloat16", 1, 3, 48, 40, 300, 128, False, False),  # G from zero, 40 of 64 rows
    ("float16", 1, 2, 64, 64, 20, 64, True, True),  # one short chunk: one step
    # the last chunk (visited first) one step long: H_c of the next chunk is issued only once
    # every thread has read this one's
    ("bfloat16", 1, 2, 32, 64, 3 * 256 + 5, 256, False, True),
]


@pytest.mark.parametrize("case", BWD_STATE_PASS_CASES, ids=lambda c: "-".join(str(v) for v in c))
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "pair"])
def test_backward_fused_state_passing(
    case: tuple, fused: bool, rule: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L_c and the reverse state passing as one sm_90a kernel (ssd_bwd_dstate_pass: dS_c, the
    df_c partials behind dA / ddt, dinitial_states) against float64 under the rule, and the
    pair it replaces (FLASHSCAN_SSD_BWD_STATE_PASS=0) the same way: chunk sizes 64..256, both
    16-bit dtypes, tails of every tile dimension (headdim 40 / 136, dstate 48 / 200), groups,
    with and without initial and final states; the kernels launched checked against the
    switch (FLASHSCAN_SSD_BWD_STATE_PASS=1 / 0)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("ssd_bwd_dstate_pass is sm_90a's")
    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DX16", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DSTATE_HILO", raising=False)
    monkeypatch.setenv("FLASHSCAN_SSD_BWD_STATE_PASS", "1" if fused else "0")
    dt_name, g, h, n, p, L, chunk, init, final = case
    dtype = DTYPES[dt_name]
    a = ssd_inputs(2, L, h, p, g, n, dtype, D2=True, init=init)
    del a["z"]  # (the 16-bit kernels' calls; flashscan.torch keeps H_c for them)
    names = _bwd_kernel_names(a, chunk)
    want = set(bwd_state_kernels())
    assert ("ssd_bwd_dstate_pass" in want) == fused
    assert want <= names, sorted(n for n in names if "state" in n)
    other = {"ssd_bwd_dstate_pass", "ssd_bwd_chunk_dstate16", "ssd_bwd_state_passing"} - want
    assert not (other & names), sorted(other & names)
    dout, dfinal = upstream(a, final=final)
    ref = ref_grads(a, chunk, dout, dfinal)
    base = grads_of(lambda lv: baseline_lowp(lv, chunk, True), a, dout, dfinal)
    got = grads_of(ours(a, chunk), a, dout, dfinal)
    check_grads(rule, got, ref, base, dtype)


@pytest.mark.parametrize(
    "shape",
    [(2, 300, 6, 64, 2, 64, 64), (32, 60, 8, 64, 1, 64, 256)],
    ids=["b2-L300-3heads-per-group", "realtime-b32-L60"],
)
def test_backward_16bit_head_shares_change_only_the_sum_order(
    shape: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dc16 / db16 split their head loop over FLASHSCAN_SSD_DCDB_SHARES CTAs (the default picks
    a count by grid size): every share count gives the same gradients, bitwise for everything
    but dB / dC (the same per-head terms; only the order of the fp32 sum over heads differs),
    and dB / dC within a few 16-bit ulps; the shares cover every head once (2 and 3 do not
    divide 3 heads evenly)."""
    b, L, h, p, g, n, chunk = shape
    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DX16", raising=False)
    a = ssd_inputs(b, L, h, p, g, n, torch.bfloat16, D2=True)
    del a["z"]
    dout, dfinal = upstream(a)
    got = {}
    for k in ("1", "2", "3", None):
        if k is None:
            monkeypatch.delenv("FLASHSCAN_SSD_DCDB_SHARES", raising=False)
        else:
            monkeypatch.setenv("FLASHSCAN_SSD_DCDB_SHARES", k)
        got[k] = grads_of(ours(a, chunk), a, dout, dfinal)
    one = got["1"]
    for k, g2 in got.items():
        assert set(g2) == set(one)
        for name, v in g2.items():
            if name in ("B", "C"):
                err = (v.float() - one[name].float()).abs().max().item()
                scale = one[name].float().abs().max().item()
                assert err <= 2 * 2.0**-8 * scale, (k, name, err, scale)
            else:
                assert torch.equal(v, one[name]), (k, name)


@pytest.mark.parametrize("seqlen", [1, 60, 200])
def test_backward_16bit_without_carried_state(
    seqlen: int, rule: Any, poison: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16-bit call of one chunk without initial or final states (the real-time shape) has no
    carried state: its backward launches neither the chunk states and state passing of the
    recompute, nor L_c, nor the reverse state passing (nothing reads H_c, f_c, dS_c or the df
    partials; ssd_bwd_dt takes df = 0), and every gradient still follows the rule against
    float64. A call with carried states runs first, so the scratch the skipped kernels would
    have written holds its values (a stale read shows in dA). With initial states the same
    call launches them all."""
    from torch.profiler import ProfilerActivity, profile

    import flashscan.torch as fst

    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DX16", raising=False)
    chunk = 256
    a = ssd_inputs(4, seqlen, 4, 64, 1, 64, torch.bfloat16, D2=True, init=False)
    del a["z"]
    warm = ssd_inputs(4, seqlen, 4, 64, 1, 64, torch.bfloat16, D2=True)
    del warm["z"]
    grads_of(ours(warm, chunk), warm, *upstream(warm))
    dout, _ = upstream(a, final=False)
    ref = ref_grads(a, chunk, dout, None)
    base = grads_of(lambda lv: baseline_lowp(lv, chunk, True), a, dout, None)
    poison(4 * seqlen * 4 * 64 * 2, 4 * seqlen * 64 * 2)
    got = grads_of(ours(a, chunk), a, dout, None)
    check_grads(rule, got, ref, base, torch.bfloat16)

    carried = {*state_kernels(False, True), *bwd_state_kernels()}

    def names(t: dict[str, Any]) -> set[str]:
        lv = leaves(t)
        step = lambda: torch.autograd.grad(  # noqa: E731
            fst.mamba_chunk_scan_combined(**lv, chunk_size=chunk, dt_softplus=True),
            [v for v in lv.values() if v is not None],
            dout,
        )
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return {e.name for e in prof.events()}

    without = names(a)
    assert "ssd_bwd_chunk_dx16" in without, sorted(n for n in without if "ssd" in n)
    assert not (carried & without), sorted(carried & without)
    a["initial_states"] = torch.randn(4, 4, 64, 64, device="cuda") * 0.5
    assert carried <= names(a)


def test_backward_16bit_kernels_read_strided_unaligned_views(rule: Any) -> None:
    """x, B, C and dt as views of one projection (Mamba-2's in_proj split, z left out as the
    layer passes none) whose rows do not start on 16-byte boundaries, the gradient taken through
    the views: the 16-bit kernels' element loads and stores; every slice of the projection's
    gradient against float64."""
    import flashscan.torch as fst

    b, L, h, p, g, n = 2, 300, 4, 64, 1, 64
    sizes = [1, h * p, g * n, g * n, h]
    proj = (torch.randn(b, L, sum(sizes), device="cuda") * 0.5).to(torch.bfloat16)
    proj.requires_grad_(True)
    _, x, B, C, dt = torch.split(proj, sizes, dim=-1)
    fixed = {
        "A": -torch.rand(h, device="cuda") - 0.5,
        "D": torch.randn(h, device="cuda"),
        "dt_bias": torch.rand(h, device="cuda"),
    }
    views = {
        "x": x.reshape(b, L, h, p),
        "B": B.reshape(b, L, g, n),
        "C": C.reshape(b, L, g, n),
        "dt": dt,
    }
    assert views["x"].data_ptr() % 16 != 0 and not views["x"].is_contiguous()
    dense = {k: v.detach().contiguous() for k, v in views.items()} | fixed
    dense["initial_states"] = None
    dense["z"] = None
    dout, dfinal = upstream(dense)
    out, final = fst.mamba_chunk_scan_combined(
        **views, **fixed, chunk_size=128, dt_softplus=True, return_final_states=True
    )
    (gp,) = torch.autograd.grad([out, final], [proj], [dout, dfinal])
    _, gx, gB, gC, gdt = torch.split(gp, sizes, dim=-1)
    got = {"x": gx, "B": gB, "C": gC, "dt": gdt}
    ref = ref_grads(dense, 128, dout, dfinal)
    base = grads_of(lambda lv: baseline_lowp(lv, 128, True), dense, dout, dfinal)
    for k, v in got.items():
        v = v.reshape(ref[k].shape)
        rule.check(v, ref[k], base[k], atol=1e-6, rtol=GRAD_RTOL[torch.bfloat16], name=f"d{k}")


def test_backward_float64_cuda_runs_the_reference(rule: Any) -> None:
    a = {k: v.double() for k, v in ssd_inputs(1, 40, 2, 8, 1, 4, torch.float64).items()}
    dout, dfinal = upstream(a)
    ref = ref_grads(a, 16, dout, dfinal)
    got = grads_of(ours(a, 16), a, dout, dfinal)
    for k in ref:
        rule.rel(got[k], ref[k], 1e-10, atol=1e-12, name=f"d{k}")


def test_backward_cuda_graph_capture_and_replay(rule: Any, bwd_path: str) -> None:
    """Forward and backward captured in one CUDA graph (a training step's SSD part): the
    backward's stream-ordered scratch and caller-allocated gradients replay on new inputs."""
    a = ssd_inputs(4, 60, 8, 64, 1, 64, torch.bfloat16)  # the small real-time shape, batch 4
    lv = leaves(a)
    names = [k for k in GRAD_NAMES if lv.get(k) is not None]
    dout, dfinal = upstream(a)
    step = ours(a, 256)

    def run() -> tuple[Any, ...]:
        out, final = step(lv)
        return torch.autograd.grad((out, final), [lv[k] for k in names], (dout, dfinal))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        grads = run()
    for _step in range(2):
        fresh = ssd_inputs(4, 60, 8, 64, 1, 64, torch.bfloat16)
        with torch.no_grad():
            for k in ("x", "dt", "B", "C", "z", "initial_states"):
                lv[k].copy_(fresh[k])
                a[k] = fresh[k]
            for t in grads:
                t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = ref_grads(a, 256, dout, dfinal)
        got = dict(zip(names, grads))
        base = grads_of(lambda lv2: baseline_lowp(lv2, 256, True), a, dout, dfinal)
        check_grads(rule, got, ref, base, torch.bfloat16)


def _launches(fn: Any, names: tuple[str, ...]) -> dict[str, int]:
    """How many times each kernel in `names` ran during one (warm) call of fn."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {n: sum(e.name == n for e in prof.events()) for n in names}


# (dtype, ngroups, dstate, headdim, seqlen, chunk, seq_idx cuts or None)
KEPT_CASES = [
    ("bfloat16", 1, 128, 64, 2 * 256 + 37, 256, None),
    ("float16", 2, 64, 64, 600, 128, (0, 1, 5, 200, 256, 300, 511)),
    # element rows: dstate 21 / headdim 42 (one-element state passing threads, 2-byte H_c reads)
    ("bfloat16", 2, 21, 42, 333, 64, None),
]


@pytest.mark.parametrize("case", KEPT_CASES, ids=lambda c: "-".join(str(v) for v in c[:6]))
def test_backward_takes_the_forward_states(
    case: tuple, rule: Any, poison: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16-bit forward without z keeps its 16-bit H_c and chunk decays for the backward, which
    then recomputes neither (one launch of each state kernel, `state_kernels`, per forward +
    backward, two under FLASHSCAN_SSD_KEEP_STATES=0). Where the pair (ssd_bwd_chunk_dstate16 +
    ssd_bwd_state_passing) runs both times, the gradients that do not pass through the df sums
    (dx, dB, dC, dD, dinitial_states) are bitwise the recompute's (the kept H_c are the values the
    backward rounded itself); where the kept H_c take ssd_bwd_dstate_pass (sm_90a, the default),
    dC and dD are. Every gradient holds the rule against float64 both times."""
    dt_name, g, n, p, L, chunk, cuts = case
    dtype = DTYPES[dt_name]
    monkeypatch.delenv("FLASHSCAN_SSD_BWD", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_DX16", raising=False)
    monkeypatch.delenv("FLASHSCAN_SSD_FWD", raising=False)
    a = ssd_inputs(2, L, 4, p, g, n, dtype, D2=True)
    del a["z"]
    kw: dict[str, Any] = {}
    seq_np = None
    if cuts is not None:
        seq = (torch.arange(L, device="cuda")[:, None] >= torch.tensor(cuts, device="cuda")).sum(-1)
        seq = (seq - 1).to(torch.int32)
        kw["seq_idx"] = torch.stack([seq, torch.zeros_like(seq)])
        seq_np = kw["seq_idx"].cpu().numpy()
    dout, dfinal = upstream(a)
    ref = ref_grads(a, chunk, dout, dfinal, **({} if seq_np is None else {"seq_idx": seq_np}))
    if cuts is None:
        base = grads_of(lambda lv: baseline_lowp(lv, chunk, True), a, dout, dfinal)
    else:
        base = grads_of(lambda lv: baseline_packed(lv, chunk, kw["seq_idx"]), a, dout, dfinal)
    step = state_kernels(cuts is not None, p % 8 == 0 and n % 8 == 0)
    got = {}
    for keep in ("1", "0"):
        monkeypatch.setenv("FLASHSCAN_SSD_KEEP_STATES", keep)
        poison(2 * L * 4 * p * a["x"].element_size(), 2 * L * g * n * a["B"].element_size())
        got[keep] = grads_of(ours(a, chunk, **kw), a, dout, dfinal)
        runs = _launches(lambda: grads_of(ours(a, chunk, **kw), a, dout, dfinal), step)
        assert runs == dict.fromkeys(step, 1 if keep == "1" else 2), (keep, runs)
        check_grads(rule, got[keep], ref, base, dtype)
    # ssd_bwd_dstate_pass takes only the kept H_c (the recompute runs the pair): its dS_c is
    # rounded from another fp32 order, so what flows from dS_c (dx, dB, dinitial_states) may
    # differ in the last bit from the recompute's (each held the rule above); dC and dD do not
    # read dS_c
    fused = bwd_state_kernels(True, cuts is not None) == ("ssd_bwd_dstate_pass",)
    fused = fused and n % 8 == 0 and p % 8 == 0
    for k in ("C", "D") if fused else ("x", "B", "C", "D", "initial_states"):
        assert torch.equal(got["1"][k], got["0"][k]), k


# (dtype, ngroups, dstate, headdim, chunk, cu_seqlens, initial states)
VARLEN_CASES = [
    # sequences across chunk boundaries, an empty one, a one-position one, one ending on a boundary
    ("bfloat16", 1, 64, 64, 64, (0, 37, 37, 300, 301, 384, 700), False),
    ("float16", 2, 128, 64, 256, (0, 5, 600, 700), True),
    # dstate 24 / headdim 40: partial tiles; one sequence without seq_idx
    ("bfloat16", 2, 24, 40, 128, (0, 333), True),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{c[0]}-c{c[4]}-n{len(c[5]) - 1}")
def test_varlen_states_match_the_reference(
    case: tuple, rule: Any, poison: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """return_varlen_states on the GPU (ssd2_varlen_states): each packed sequence's final state
    against float64 (each sequence scanned alone from zero, sequence 0 from the initial state)
    under the rule, the same-precision baseline being the plain torch SSD of that sequence
    alone; out and final_states unchanged by asking for them; empty sequences exact."""
    dt_name, g, n, p, chunk, cuts, init = case
    dtype = DTYPES[dt_name]
    monkeypatch.delenv("FLASHSCAN_SSD_FWD", raising=False)
    L = cuts[-1]
    a = ssd_inputs(1, L, 4, p, g, n, dtype, init=init)
    cu = torch.tensor(cuts, device="cuda", dtype=torch.int32)
    pos = torch.arange(L, device="cuda")
    seq = ((pos[:, None] >= cu[1:-1][None, :]).sum(-1)).to(torch.int32)[None]
    kw = dict(chunk_size=chunk, dt_softplus=True, seq_idx=seq)
    poison(L * 4 * p * a["x"].element_size(), L * g * n * a["B"].element_size())
    out, final, varlen = flashscan.mamba_chunk_scan_combined(
        **a, **kw, cu_seqlens=cu, return_final_states=True, return_varlen_states=True
    )
    out0, final0 = flashscan.mamba_chunk_scan_combined(**a, **kw, return_final_states=True)
    assert torch.equal(out, out0) and torch.equal(final, final0)
    assert varlen.shape == (len(cuts) - 1, 4, p, n) and varlen.dtype == torch.float32
    host = {k: None if v is None else v.detach().double().cpu().numpy() for k, v in a.items()}
    _, _, ref = reference_ssd.mamba_chunk_scan_combined(
        **host, chunk_size=chunk, dt_softplus=True, seq_idx=seq.cpu().numpy(),
        cu_seqlens=np.asarray(cuts), return_final_states=True, return_varlen_states=True,
    )  # fmt: skip
    base = []
    for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        h0 = a["initial_states"][0] if init and i == 0 else torch.zeros_like(varlen[0])
        if hi == lo:
            assert torch.equal(varlen[i], h0.float()), i
            base.append(h0.float())
            continue
        piece = {k: v for k, v in a.items()}
        for k in ("x", "dt", "B", "C", "z"):
            piece[k] = a[k][:, lo:hi]
        piece["initial_states"] = h0[None] if init and i == 0 else None
        base.append(baseline_lowp(piece, chunk, True)[1][0])
    rule.check(varlen, torch.from_numpy(ref), torch.stack(base), atol=1e-5, name="varlen_states")


def test_varlen_states_through_the_torch_op() -> None:
    """flashscan.torch with inputs that need gradients: the varlen states come from a forward of
    their own (no gradient through them, as in mamba_ssm) and equal the core call's."""
    import flashscan.torch as fst

    a = ssd_inputs(1, 300, 4, 64, 1, 64, torch.bfloat16, init=False)
    cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
    seq = (torch.arange(300, device="cuda") >= 100).to(torch.int32)[None]
    kw = dict(chunk_size=128, dt_softplus=True, seq_idx=seq, cu_seqlens=cu)
    want = flashscan.mamba_chunk_scan_combined(**a, **kw, return_varlen_states=True)[1]
    leaves = {k: v.clone().requires_grad_(True) for k, v in a.items() if v is not None}
    out, got = fst.mamba_chunk_scan_combined(**leaves, **kw, return_varlen_states=True)
    assert out.requires_grad and not got.requires_grad
    assert torch.equal(got, want)


def test_kept_states_survive_a_second_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward reads the forward's kept H_c and chunk decays and never writes them: a
    second backward of the same graph (retain_graph) gives bitwise the first one's gradients."""
    import flashscan.torch as fst

    monkeypatch.delenv("FLASHSCAN_SSD_KEEP_STATES", raising=False)
    a = ssd_inputs(2, 600, 4, 64, 1, 64, torch.bfloat16)
    del a["z"]
    lv = leaves(a)
    out, final = fst.mamba_chunk_scan_combined(
        **lv, chunk_size=128, dt_softplus=True, return_final_states=True
    )
    dout, dfinal = upstream(a)
    names = [k for k in GRAD_NAMES if lv.get(k) is not None]
    first = torch.autograd.grad(
        [out, final], [lv[k] for k in names], [dout, dfinal], retain_graph=True
    )
    second = torch.autograd.grad([out, final], [lv[k] for k in names], [dout, dfinal])
    for k, g1, g2 in zip(names, first, second):
        assert torch.equal(g1, g2), k


def test_compiled_training_takes_the_forward_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile(fullgraph) of a 16-bit SSD block without z: the forward op keeps its 16-bit
    H_c and decays and the backward op reads them (one launch of each state kernel a step, as
    in eager), with the eager step's gradients bitwise."""
    import flashscan.torch as fst

    monkeypatch.delenv("FLASHSCAN_SSD_KEEP_STATES", raising=False)
    torch._dynamo.reset()
    a = ssd_inputs(2, 600, 4, 64, 1, 64, torch.bfloat16)
    del a["z"]
    names = [k for k in GRAD_NAMES if a.get(k) is not None]

    def block(*args: Any) -> Any:
        out, final = fst.mamba_chunk_scan_combined(
            **dict(zip(names, args)), chunk_size=128, dt_softplus=True, return_final_states=True
        )
        return out.float().square().sum() + final.square().sum()

    lv = [a[k].detach().clone().requires_grad_(True) for k in names]
    want = torch.autograd.grad(block(*lv), lv)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(*lv), lv)
    for k, g, w in zip(names, got, want):
        assert torch.equal(g, w), k
    step = state_kernels(False, True)
    runs = _launches(lambda: torch.autograd.grad(compiled(*lv), lv), step)
    assert runs == dict.fromkeys(step, 1), runs
