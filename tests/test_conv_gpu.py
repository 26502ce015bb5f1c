"""GPU tests of the causal conv1d kernels (torch on CUDA).

The correctness rule over dtypes (fp32/fp16/bf16, weight in x's dtype or fp32), widths 2..4,
both layouts (channel-first, channel-last), odd lengths incl. seqlen 1, with bias / SiLU /
initial and final states / seq_idx. Reference: `reference_conv` in float64 on host copies.
Baseline for 16-bit outputs: torch's own depthwise conv1d (F.conv1d with groups=dim) run in the
same dtype; fp32 outputs: 1e-4 relative. Also: outputs poisoned with NaN through the native
entry (every element written), gradients vs the float64 reference backward (baseline: torch
autograd of the same-precision F.conv1d), the decode update (shift and ring modes, state in
place), and CUDA graph capture.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import reference_conv as rc

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SEQLENS = [1, 2, 7, 63, 65, 1000, 4097]
WIDTHS = [2, 3, 4]
FP32_RTOL = 1e-4
_FIXTURES: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _conftest_helpers(rule: Any, poison: Any) -> None:
    """The correctness rule and the allocator poisoning of conftest, for the helpers below."""
    _FIXTURES["rule"] = rule
    _FIXTURES["poison"] = poison


def check_rule(*args: Any, **kwargs: Any) -> Any:
    return _FIXTURES["rule"].check(*args, **kwargs)


def host(t: Any) -> Any:
    return None if t is None else t.detach().double().cpu().numpy()


def make_x(batch: int, dim: int, seqlen: int, dtype: Any, layout: str) -> Any:
    if layout == "cl":
        return torch.randn(batch, seqlen, dim, device="cuda", dtype=dtype).transpose(1, 2)
    return torch.randn(batch, dim, seqlen, device="cuda", dtype=dtype)


def full_walk_batch(dim: int, seqlen: int) -> int:
    """The smallest batch at which the channel-last kernels keep their full walks (32 positions
    a forward warp, 64 a backward one): src/ops/conv1d.rs `cl_rows` halves a walk while the
    grid of the half still fits one wave of blocks (4 an SM forward, 3 backward); the lean walks
    only run at full length."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    lanes = -(-dim // 128)
    # blocks of 4 warps at half the walk: lanes x batch x ceil(seqlen / (4 * full / 2))
    fwd = sms * 4 // (lanes * -(-seqlen // 64)) + 1
    bwd = sms * 3 // (lanes * -(-seqlen // 128)) + 1
    return max(2, fwd, bwd)


def torch_conv(x: Any, w: Any, b: Any, init: Any, silu: bool, dtype: Any) -> Any:
    """The plain same-precision implementation: F.conv1d over [init | x] in `dtype`."""
    width = w.shape[1]
    x = x.to(dtype)
    pre = init.to(dtype) if init is not None else x.new_zeros(x.shape[0], x.shape[1], width - 1)
    xc = torch.cat([pre, x], dim=2)
    y = F.conv1d(
        xc, w.to(dtype).unsqueeze(1), None if b is None else b.to(dtype), groups=x.shape[1]
    )
    return F.silu(y) if silu else y


def check(got: Any, ref: np.ndarray, base: Any, dtype: Any, name: str) -> None:
    if dtype == torch.float32:
        check_rule(got, ref, ref, atol=1e-6, rtol=FP32_RTOL, name=name)
    else:
        check_rule(got, ref, base, atol=1e-3, name=name)


def check_grad(got: Any, ref: np.ndarray, base: Any, dtype: Any, name: str) -> None:
    """One gradient against its float64 reference under the rule."""
    assert got is not None, name
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    if dtype == torch.float32 or name in ("dweight", "dbias"):
        # fp32 sums (dweight / dbias accumulate in fp32 whatever x's dtype): relative bound
        # on top of the rule (bf16 inputs make the baseline itself coarse)
        rtol = max(FP32_RTOL, 1e-4) if dtype == torch.float32 else 1e-3
        check_rule(got, ref, base, atol=1e-6, rtol=rtol, name=name)
    else:
        check_rule(got, ref, base, atol=1e-3 + 1e-3 * scale, name=name)


def _cases() -> list[tuple[Any, ...]]:
    rnd = random.Random(14)
    full = list(
        itertools.product(DTYPES, ["same", "float32"], WIDTHS, SEQLENS, ["cf", "cl"], range(4))
    )
    cases = [c for c in full if not (c[0] == "float32" and c[1] == "same")]
    return rnd.sample(cases, 90)


@pytest.mark.parametrize("dt, wdt, width, seqlen, layout, opts", _cases())
def test_forward_rule(dt: str, wdt: str, width: int, seqlen: int, layout: str, opts: int) -> None:
    dtype = DTYPES[dt]
    wtype = dtype if wdt == "same" else torch.float32
    batch, dim = 2, 72 if opts % 2 else 136
    x = make_x(batch, dim, seqlen, dtype, layout)
    w = torch.randn(dim, width, device="cuda", dtype=wtype) / width
    b = torch.randn(dim, device="cuda", dtype=wtype) if opts >= 1 else None
    silu = opts in (1, 3)
    init = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype) if opts == 2 else None
    seq = None
    if opts == 3:
        cuts = sorted(random.Random(seqlen).sample(range(seqlen + 1), min(3, seqlen + 1)))
        s = np.zeros((batch, seqlen), np.int32)
        for c in cuts:
            s[:, c:] += 1
        s[1, : max(seqlen // 5, 1)] = -1  # padding
        seq = torch.from_numpy(s).cuda()
    ret_final = seq is None
    _FIXTURES["poison"](x.numel() * x.element_size())  # flashscan's own out starts as NaN
    r = flashscan.causal_conv1d_fn(
        x,
        w,
        b,
        init,
        return_final_states=ret_final,
        activation="silu" if silu else None,
        seq_idx=seq,
    )
    out, fin = r if ret_final else (r, None)
    assert out.shape == x.shape and out.dtype == dtype
    assert out.stride() == x.stride() or seqlen == 1
    ref, ref_fin = rc.causal_conv1d_fn(
        host(x), host(w), host(b), host(init), True, "silu" if silu else None, host(seq)
    )
    base = (
        torch_conv(x, w, b, init, silu, dtype) if seq is None else torch.from_numpy(ref).to(dtype)
    )
    check(out, ref, base, dtype, "out")
    if fin is not None:
        torch.testing.assert_close(fin.double().cpu(), torch.from_numpy(ref_fin), atol=0, rtol=0)


def _native_fwd(x: Any, w: Any, b: Any, init: Any, out: Any, fin: Any, silu: bool) -> None:
    from flashscan import _native
    from flashscan._frameworks import handler_of

    h = handler_of(x, "x")

    def d(t: Any, n: str) -> Any:
        return None if t is None else h.describe(t, n)

    _native.causal_conv1d_fwd(
        d(x, "x"),
        d(w, "weight"),
        d(b, "bias"),
        d(init, "initial_states"),
        None,
        d(out, "out"),
        d(fin, "final_states"),
        silu,
        torch.cuda.current_stream().cuda_stream,
    )


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("seqlen", [1, 5, 1031])
def test_poisoned_outputs_are_all_written(layout: str, seqlen: int) -> None:
    for dtype in DTYPES.values():
        x = make_x(3, 70, seqlen, dtype, layout)
        w = torch.randn(70, 4, device="cuda")
        b = torch.randn(70, device="cuda")
        init = torch.randn(3, 70, 3, device="cuda", dtype=dtype)
        out = torch.full_like(x, float("nan"))
        fin = torch.full((3, 70, 3), float("nan"), device="cuda", dtype=dtype)
        _native_fwd(x, w, b, init, out, fin, True)
        ref, ref_fin = rc.causal_conv1d_fn(host(x), host(w), host(b), host(init), True, "silu")
        check(out, ref, torch_conv(x, w, b, init, True, dtype), dtype, "out")
        assert not fin.isnan().any()
        torch.testing.assert_close(fin.double().cpu(), torch.from_numpy(ref_fin), atol=0, rtol=0)


@pytest.mark.parametrize(
    "dt, width, seqlen, layout, opts",
    [
        (dt, w, n, lay, o)
        for dt, w, n, lay, o in itertools.product(
            DTYPES, WIDTHS, [1, 2, 63, 1000, 4097], ["cf", "cl"], ["bias_silu", "states", "seq"]
        )
        if (w + n + len(dt)) % 3 == 0 or n == 1
    ],
)
def test_backward_rule(dt: str, width: int, seqlen: int, layout: str, opts: str) -> None:
    import flashscan.torch as fst

    dtype = DTYPES[dt]
    batch, dim = 2, 80
    x = make_x(batch, dim, seqlen, dtype, layout).requires_grad_()
    w = (torch.randn(dim, width, device="cuda") / width).requires_grad_()
    b = torch.randn(dim, device="cuda").requires_grad_() if opts != "seq" else None
    init = (
        torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype).requires_grad_()
        if opts == "states"
        else None
    )
    seq = None
    if opts == "seq":
        s = np.zeros((batch, seqlen), np.int32)
        s[:, seqlen // 3 :] = 1
        s[0, : seqlen // 7] = -1
        seq = torch.from_numpy(s).cuda()
    silu = opts != "states"
    act = "silu" if silu else None
    dout = torch.randn(batch, dim, seqlen, device="cuda", dtype=dtype)
    dfin = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype)
    if opts == "states":
        out, fin = fst.causal_conv1d_fn(x, w, b, init, return_final_states=True, activation=act)
        torch.autograd.backward((out, fin), (dout, dfin))
    else:
        out = fst.causal_conv1d_fn(x, w, b, activation=act, seq_idx=seq)
        out.backward(dout)
    want = rc.causal_conv1d_bwd(
        host(dout),
        host(x),
        host(w),
        host(b),
        host(init),
        host(dfin) if opts == "states" else None,
        act,
        host(seq),
    )
    # baseline: autograd of the same-precision torch conv (no seq_idx support there: the
    # float64 reference rounded to the dtype stands in)
    leaves = [t for t in (x, w, b, init) if t is not None]
    if seq is None:
        lc = [t.detach().clone().requires_grad_() for t in leaves]
        xb, wb = lc[0], lc[1]
        bb = lc[2] if b is not None else None
        ib = lc[-1] if init is not None else None
        yb = torch_conv(xb, wb, bb, ib, silu, dtype)
        loss = (yb.float() * dout.float()).sum()
        if init is not None:
            pre = ib.to(dtype)
            xcat = torch.cat([pre, xb.to(dtype)], dim=2)
            loss = loss + (xcat[:, :, seqlen:].float() * dfin.float()).sum()
        base = torch.autograd.grad(loss, lc)
    else:
        base = [torch.from_numpy(g).to(t.dtype) for g, t in zip(want, leaves) if g is not None]
    got = [t.grad for t in leaves]
    names = ["dx", "dweight", "dbias", "dinitial_states"]
    present = [g for g in want if g is not None]
    for g, ref, bl, n in zip(got, present, base, [n for n, v in zip(names, want) if v is not None]):
        check_grad(g, ref, bl, dtype, n)


def _cl_view(batch: int, dim: int, seqlen: int, dtype: Any, view: str) -> Any:
    """A channel-last (batch, dim, seqlen) view the kernels' row ring cannot copy as whole 8 / 16
    byte slices: `narrowed` keeps aligned rows of 76 channels but uses 74 (the last lane's slice is
    partial: zero-filled copies), `offset` starts one element into its buffer (no slice aligned:
    the synchronous path)."""
    if view == "narrowed":
        return torch.randn(batch, seqlen, 76, device="cuda", dtype=dtype)[..., :dim].transpose(1, 2)
    buf = torch.randn(batch * seqlen * dim + 1, device="cuda", dtype=dtype)
    return buf[1:].view(batch, seqlen, dim).transpose(1, 2)


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
@pytest.mark.parametrize("view", ["narrowed", "offset"])
@pytest.mark.parametrize("seqlen", [5, 97])
def test_channel_last_partial_and_unaligned_rows(dt: str, view: str, seqlen: int) -> None:
    import flashscan.torch as fst

    dtype = DTYPES[dt]
    batch, dim, width = 3, 74, 4
    x = _cl_view(batch, dim, seqlen, dtype, view).detach().requires_grad_()
    w = (torch.randn(dim, width, device="cuda") / width).requires_grad_()
    b = torch.randn(dim, device="cuda").requires_grad_()
    init = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype).requires_grad_()
    dout = _cl_view(batch, dim, seqlen, dtype, view)
    dfin = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype)
    _FIXTURES["poison"](x.numel() * x.element_size())
    out, fin = fst.causal_conv1d_fn(x, w, b, init, return_final_states=True, activation="silu")
    torch.autograd.backward((out, fin), (dout, dfin))
    ref, ref_fin = rc.causal_conv1d_fn(host(x), host(w), host(b), host(init), True, "silu")
    check(out, ref, torch_conv(x, w, b, init, True, dtype), dtype, "out")
    torch.testing.assert_close(fin.double().cpu(), torch.from_numpy(ref_fin), atol=0, rtol=0)
    want = rc.causal_conv1d_bwd(
        host(dout), host(x), host(w), host(b), host(init), host(dfin), "silu", None
    )
    leaves = [x, w, b, init]
    lc = [t.detach().clone().requires_grad_() for t in leaves]
    yb = torch_conv(lc[0], lc[1], lc[2], lc[3], True, dtype)
    xcat = torch.cat([lc[3], lc[0]], dim=2)
    loss = (yb.float() * dout.float()).sum() + (xcat[:, :, seqlen:].float() * dfin.float()).sum()
    base = torch.autograd.grad(loss, lc)
    for t, ref_g, bl, n in zip(leaves, want, base, ["dx", "dweight", "dbias", "dinitial_states"]):
        check_grad(t.grad, ref_g, bl, dtype, n)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("layout", ["cl", "cf"])
@pytest.mark.parametrize(
    "seqlen, opts",
    [(72, "bias_silu"), (304, "bias_silu"), (1000, "plain"), (1000, "states"), (4104, "bias_silu")],
)
def test_backward_lean_paths(dt: str, width: int, layout: str, seqlen: int, opts: str) -> None:
    """The backward's lean paths (no seq_idx, rows aligned, dout in x's layout as in a Mamba
    block). Channel-last (16-bit): warps of 64 positions whose walk of 64 + H rows ends inside
    the sequence; seqlen 72 is the first warp only, 304 / 1000 / 4104 all but the last (with
    `states` the first writes dinitial_states on the general walk). Width 4 is where the walk's
    last two stages are the checked ones (an unchecked middle stage once added rows 64, 65 to
    dweight: O(1) errors here). Channel-first (every dtype) at the same lengths, multiples of 8:
    rows 16-byte aligned, every interior thread's vector path. Widths 2..4; bias + SiLU,
    neither, or initial / final states. Gradients against the float64 reference under the
    rule; dx and dinit poisoned first. Channel-last runs a batch large enough for the full walks
    (`full_walk_batch`: smaller grids take shorter, general walks), and its forward output is
    checked too (the forward's lean walk)."""
    import flashscan.torch as fst

    dtype = DTYPES[dt]
    dim = 136  # channel-last: two blocks of channels, the second with lanes past dim
    batch = full_walk_batch(dim, seqlen) if layout == "cl" else 2
    x = make_x(batch, dim, seqlen, dtype, layout).detach().requires_grad_()
    w = (torch.randn(dim, width, device="cuda") / width).to(dtype).requires_grad_()
    b = torch.randn(dim, device="cuda").to(dtype).requires_grad_() if opts != "plain" else None
    init = (
        torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype).requires_grad_()
        if opts == "states"
        else None
    )
    act = None if opts == "plain" else "silu"
    dout = make_x(batch, dim, seqlen, dtype, layout)
    dfin = None
    if init is not None:
        dfin = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype)
    _FIXTURES["poison"](x.numel() * x.element_size())
    if init is not None:
        out, fin = fst.causal_conv1d_fn(x, w, b, init, return_final_states=True, activation=act)
        torch.autograd.backward((out, fin), (dout, dfin))
    else:
        out = fst.causal_conv1d_fn(x, w, b, activation=act)
        out.backward(dout)
    ref_out, _ = rc.causal_conv1d_fn(host(x), host(w), host(b), host(init), True, act)
    check(out, ref_out, torch_conv(x, w, b, init, act is not None, dtype), dtype, "out")
    want = rc.causal_conv1d_bwd(
        host(dout), host(x), host(w), host(b), host(init), host(dfin), act, None
    )
    leaves = [t for t in (x, w, b, init) if t is not None]
    lc = [t.detach().clone().requires_grad_() for t in leaves]
    bb = lc[2] if b is not None else None
    ib = lc[-1] if init is not None else None
    yb = torch_conv(lc[0], lc[1], bb, ib, act is not None, dtype)
    loss = (yb.float() * dout.float()).sum()
    if init is not None:
        xcat = torch.cat([ib, lc[0]], dim=2)
        loss = loss + (xcat[:, :, seqlen:].float() * dfin.float()).sum()
    base = torch.autograd.grad(loss, lc)
    all_names = ["dx", "dweight", "dbias", "dinitial_states"]
    names = [n for n, g in zip(all_names, want) if g is not None]
    present = [g for g in want if g is not None]
    for t, ref_g, bl, n in zip(leaves, present, base, names):
        check_grad(t.grad, ref_g, bl, dtype, n)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("ring", [False, True])
@pytest.mark.parametrize("kind", ["dense", "padded", "sliced", "long"])
def test_update_matches_reference(dt: str, width: int, ring: bool, kind: str) -> None:
    """The decode update against the reference, the state updated in place, one and three new
    inputs, shift and ring modes. `dense`: conv_state contiguous, dim 264 (two full blocks of
    128 channels and a partial one);
    `padded`: the first 258 channels of a 264-channel buffer (the rest must stay as they were);
    `sliced`: a view into a buffer wider along state_len (its other columns must stay); `long`:
    state_len 13-16."""
    dtype = DTYPES[dt]
    batch, dim = 5, (258 if kind == "padded" else 264)
    state_len = width - 1 + (3 if ring else 0) + (10 if kind == "long" else 0)
    for n in (None, 1, 3):
        x = torch.randn(batch, dim, *(() if n is None else (n,)), device="cuda", dtype=dtype)
        if kind == "sliced":
            buf = torch.randn(batch, dim, state_len + 2, device="cuda", dtype=dtype)
            state = buf[:, :, 1 : 1 + state_len]
            edges = buf[:, :, [0, state_len + 1]].clone()
        elif kind == "padded":
            buf = torch.randn(batch, 264, state_len, device="cuda", dtype=dtype)
            state = buf[:, :dim]
            edges = buf[:, dim:].clone()
        else:
            state = torch.randn(batch, dim, state_len, device="cuda", dtype=dtype)
        w = torch.randn(dim, width, device="cuda")
        b = torch.randn(dim, device="cuda")
        lens = torch.randint(0, 50, (batch,), device="cuda", dtype=torch.int32) if ring else None
        want, want_state = rc.causal_conv1d_update(
            host(x), host(state), host(w), host(b), "silu", host(lens)
        )
        out = flashscan.causal_conv1d_update(x, state, w, b, activation="silu", cache_seqlens=lens)
        base = torch.from_numpy(want).to(dtype)
        check(out, want, base, dtype, "out")
        torch.testing.assert_close(
            state.double().cpu(), torch.from_numpy(want_state), atol=0, rtol=0
        )
        if kind == "sliced":
            assert torch.equal(buf[:, :, [0, state_len + 1]], edges)
        if kind == "padded":
            assert torch.equal(buf[:, dim:], edges)


def test_update_with_offsets_past_2_31() -> None:
    """A conv_state whose second batch row lies 2^31 elements after the first (a view into a
    4 GiB buffer): the update's 64-bit index path (32-bit only where every offset fits)."""
    dtype, dim, state_len = torch.bfloat16, 64, 3
    buf = torch.zeros(2**31 + dim * state_len, device="cuda", dtype=dtype)
    state = buf.as_strided((2, dim, state_len), (2**31, state_len, 1))
    state.copy_(torch.randn(2, dim, state_len, device="cuda", dtype=dtype))
    x = torch.randn(2, dim, device="cuda", dtype=dtype)
    w = torch.randn(dim, 4, device="cuda")
    want, want_state = rc.causal_conv1d_update(host(x), host(state), host(w), None, "silu", None)
    out = flashscan.causal_conv1d_update(x, state, w, activation="silu")
    check(out, want, torch.from_numpy(want).to(dtype), dtype, "out")
    torch.testing.assert_close(state.double().cpu(), torch.from_numpy(want_state), atol=0, rtol=0)
    del buf, state


def test_graph_capture() -> None:
    x = torch.randn(4, 256, 300, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 4, device="cuda")
    b = torch.randn(256, device="cuda")
    xs = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    state = torch.randn(4, 256, 3, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up: compile and plan outside the capture
            flashscan.causal_conv1d_fn(x, w, b, activation="silu")
            flashscan.causal_conv1d_update(xs, state.clone(), w, b, activation="silu")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flashscan.causal_conv1d_fn(x, w, b, activation="silu")
        step = flashscan.causal_conv1d_update(xs, state, w, b, activation="silu")
    x.copy_(torch.randn_like(x))
    xs.copy_(torch.randn_like(xs))
    before = state.clone()
    g.replay()
    torch.cuda.synchronize()
    ref = rc.causal_conv1d_fn(host(x), host(w), host(b), activation="silu")
    check(out, ref, torch_conv(x, w, b, None, True, torch.bfloat16), torch.bfloat16, "out")
    want, want_state = rc.causal_conv1d_update(host(xs), host(before), host(w), host(b), "silu")
    check(step, want, torch.from_numpy(want).to(torch.bfloat16), torch.bfloat16, "update")
    torch.testing.assert_close(state.double().cpu(), torch.from_numpy(want_state), atol=0, rtol=0)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seqlen", [2048, 4112])
@pytest.mark.parametrize("opts", ["plain", "bias_silu", "init"])
def test_channel_first_fast_forward(dt: str, width: int, seqlen: int, opts: str) -> None:
    """Channel-first rows of 2 x 16-byte multiples, aligned, no seq_idx or final states: every
    thread of the launch takes the fast body (causal_conv1d_fwd_cf_fast; 4112 = two chunks, the
    second partial). Poisoned out; initial_states reach the first thread of each row."""
    dtype = DTYPES[dt]
    batch, dim = 2, 72
    x = make_x(batch, dim, seqlen, dtype, "cf")
    w = torch.randn(dim, width, device="cuda", dtype=dtype) / width
    b = torch.randn(dim, device="cuda", dtype=dtype) if opts == "bias_silu" else None
    act = "silu" if opts == "bias_silu" else None
    init = (
        torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype) if opts == "init" else None
    )
    _FIXTURES["poison"](x.numel() * x.element_size())
    out = flashscan.causal_conv1d_fn(x, w, b, init, activation=act)
    ref, _ = rc.causal_conv1d_fn(host(x), host(w), host(b), host(init), True, act)
    check(out, ref, torch_conv(x, w, b, init, act is not None, dtype), dtype, "out")


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("batch, dim, seqlen", [(32, 640, 60), (1, 640, 60), (3, 200, 17)])
def test_short_sequences(dt: str, layout: str, batch: int, dim: int, seqlen: int) -> None:
    """The real-time shapes (Mamba-2 b32 L60 d640, b1) and an odd one: channel-first rows
    shorter than a block's positions share blocks (several rows a block), channel-last grids
    with few warps walk 4-16 positions a warp. Forward (poisoned out) and gradients under the
    rule, bias + SiLU + final states."""
    import flashscan.torch as fst

    dtype = DTYPES[dt]
    x = make_x(batch, dim, seqlen, dtype, layout).detach().requires_grad_()
    w = (torch.randn(dim, 4, device="cuda") / 4).to(dtype).requires_grad_()
    b = torch.randn(dim, device="cuda").to(dtype).requires_grad_()
    dout = make_x(batch, dim, seqlen, dtype, layout)
    _FIXTURES["poison"](x.numel() * x.element_size())
    out, fin = fst.causal_conv1d_fn(x, w, b, return_final_states=True, activation="silu")
    ref_out, ref_fin = rc.causal_conv1d_fn(host(x), host(w), host(b), None, True, "silu")
    check(out, ref_out, torch_conv(x, w, b, None, True, dtype), dtype, "out")
    torch.testing.assert_close(fin.double().cpu(), torch.from_numpy(ref_fin), atol=0, rtol=0)
    out.backward(dout)
    want = rc.causal_conv1d_bwd(host(dout), host(x), host(w), host(b), None, None, "silu", None)
    lc = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    loss = (torch_conv(lc[0], lc[1], lc[2], None, True, dtype).float() * dout.float()).sum()
    base = torch.autograd.grad(loss, lc)
    for t, ref_g, bl, n in zip((x, w, b), want, base, ("dx", "dweight", "dbias")):
        check_grad(t.grad, ref_g, bl, dtype, n)


def short_walk_weights(dim: int, width: int, dtype: Any, kind: str) -> tuple[Any, Any]:
    """Weight and bias for the short walks' two weight loads (src/ops/conv1d.rs
    `weights_packed`): "packed" (contiguous, aligned: one run of vector loads a lane), "f32"
    (fp32 weight and bias: 16-byte vectors), "transposed" (a (width, dim) buffer's transpose, no
    bias), "offset" (a contiguous view one element into its buffer, a bias of stride 2): the
    last two take the per-element loads."""
    wd = torch.float32 if kind == "f32" else dtype
    if kind == "transposed":
        return (torch.randn(width, dim, device="cuda") / width).to(wd).t(), None
    if kind == "offset":
        buf = (torch.randn(dim * width + 1, device="cuda") / width).to(wd)
        return buf[1:].view(dim, width), torch.randn(2 * dim, device="cuda").to(wd)[::2]
    w = (torch.randn(dim, width, device="cuda") / width).to(wd)
    return w, torch.randn(dim, device="cuda").to(wd)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", ["packed", "f32", "transposed", "offset"])
@pytest.mark.parametrize("batch, dim, seqlen", [(32, 640, 60), (3, 128, 13)])
def test_channel_last_short_walk_weight_layouts(
    dt: str, width: int, kind: str, batch: int, dim: int, seqlen: int
) -> None:
    """The channel-last short walks (forward and backward) over every weight / bias layout they
    load from, every width: interior warps (all rows inside the sequence) and edge warps (rows
    before 0 or past the end) in one call at L60; at L13 every warp is an edge warp. Forward
    poisoned, SiLU; gradients of x, weight and bias under the rule."""
    import flashscan.torch as fst

    dtype = DTYPES[dt]
    x = make_x(batch, dim, seqlen, dtype, "cl").detach().requires_grad_()
    w0, b0 = short_walk_weights(dim, width, dtype, kind)
    w = w0.detach().requires_grad_()
    b = None if b0 is None else b0.detach().requires_grad_()
    dout = make_x(batch, dim, seqlen, dtype, "cl")
    _FIXTURES["poison"](x.numel() * x.element_size())
    out = fst.causal_conv1d_fn(x, w, b, activation="silu")
    ref_out = rc.causal_conv1d_fn(host(x), host(w), host(b), None, False, "silu")
    check(out, ref_out, torch_conv(x, w, b, None, True, dtype), dtype, "out")
    out.backward(dout)
    want = rc.causal_conv1d_bwd(host(dout), host(x), host(w), host(b), None, None, "silu", None)
    lc = [None if t is None else t.detach().clone().requires_grad_() for t in (x, w, b)]
    loss = (torch_conv(lc[0], lc[1], lc[2], None, True, dtype).float() * dout.float()).sum()
    base = torch.autograd.grad(loss, [t for t in lc if t is not None])
    for t, ref_g, bl, n in zip((x, w, b), want, base, ("dx", "dweight", "dbias")):
        check_grad(t.grad, ref_g, bl, dtype, n)


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seqlen", [64, 1000, 4104])
@pytest.mark.parametrize("opts", ["plain", "bias_states"])
def test_channel_last_wide_forward(dt: str, width: int, seqlen: int, opts: str) -> None:
    """The wide channel-last forward (8 channels a lane, src/ops/conv1d.rs `cl_wide`): full-walk
    batches of 16-bit x, dim 264 (a second block column with one working lane), seqlen 64 (two
    warps, the last writing final states row by row), 1000 (a partial last warp), 4104; with
    bias, initial and final states or with none. Forward poisoned, against float64 under the
    rule; final states exact."""
    dtype = DTYPES[dt]
    dim = 264
    batch = full_walk_batch(dim, seqlen)
    x = make_x(batch, dim, seqlen, dtype, "cl")
    w = (torch.randn(dim, width, device="cuda") / width).to(dtype)
    states = opts == "bias_states"
    b = torch.randn(dim, device="cuda").to(dtype) if states else None
    init = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype) if states else None
    _FIXTURES["poison"](x.numel() * x.element_size())
    r = flashscan.causal_conv1d_fn(x, w, b, init, return_final_states=states, activation="silu")
    out, fin = r if states else (r, None)
    ref = rc.causal_conv1d_fn(host(x), host(w), host(b), host(init), states, "silu")
    ref_out, ref_fin = ref if states else (ref, None)
    check(out, ref_out, torch_conv(x, w, b, init, True, dtype), dtype, "out")
    if states:
        torch.testing.assert_close(fin.double().cpu(), torch.from_numpy(ref_fin), atol=0, rtol=0)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("batch, dim, seqlen", [(32, 640, 60), (2, 72, 9), (2, 72, 2)])
def test_channel_last_short_walks_with_states(
    dt: str, silu: bool, batch: int, dim: int, seqlen: int
) -> None:
    """The channel-last short-walk entries (grids short of a wave: 4 or 8 positions a warp) with
    initial and final states: the forward's short kernel reads initial_states before position 0
    and writes the final states (L 2 < H: partly initial_states), the backward (dinitial_states,
    dfinal_states) takes the general walk. Forward poisoned; every gradient against float64."""
    import flashscan.torch as fst

    dtype = DTYPES[dt]
    width = 4
    act = "silu" if silu else None
    x = make_x(batch, dim, seqlen, dtype, "cl").detach().requires_grad_()
    w = (torch.randn(dim, width, device="cuda") / width).to(dtype).requires_grad_()
    b = torch.randn(dim, device="cuda").to(dtype).requires_grad_()
    # channel-last initial states, as causal-conv1d takes them: (batch, width - 1, dim) transposed
    init = torch.randn(batch, width - 1, dim, device="cuda", dtype=dtype).transpose(1, 2)
    init = init.detach().requires_grad_()
    dout = make_x(batch, dim, seqlen, dtype, "cl")
    dfin = torch.randn(batch, dim, width - 1, device="cuda", dtype=dtype)
    _FIXTURES["poison"](x.numel() * x.element_size())
    out, fin = fst.causal_conv1d_fn(x, w, b, init, return_final_states=True, activation=act)
    ref_out, ref_fin = rc.causal_conv1d_fn(host(x), host(w), host(b), host(init), True, act)
    check(out, ref_out, torch_conv(x, w, b, init, silu, dtype), dtype, "out")
    torch.testing.assert_close(fin.double().cpu(), torch.from_numpy(ref_fin), atol=0, rtol=0)
    torch.autograd.backward([out, fin], [dout, dfin])
    want = rc.causal_conv1d_bwd(
        host(dout), host(x), host(w), host(b), host(init), host(dfin), act, None
    )
    lc = [t.detach().clone().requires_grad_() for t in (x, w, b, init)]
    y = torch_conv(lc[0], lc[1], lc[2], lc[3], silu, dtype)
    xc = torch.cat([lc[3], lc[0]], dim=2)[:, :, -(width - 1) :]
    loss = (y.float() * dout.float()).sum() + (xc.float() * dfin.float()).sum()
    base = torch.autograd.grad(loss, lc)
    for t, ref_g, bl, n in zip(
        (x, w, b, init), want, base, ("dx", "dweight", "dbias", "dinitial_states")
    ):
        check_grad(t.grad, ref_g, bl, dtype, n)
    # without states the backward takes its short kernel too (both activations)
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))
    fst.causal_conv1d_fn(x2, w2, b2, activation=act).backward(dout)
    want = rc.causal_conv1d_bwd(host(dout), host(x), host(w), host(b), None, None, act, None)
    lc = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    loss = (torch_conv(lc[0], lc[1], lc[2], None, silu, dtype).float() * dout.float()).sum()
    base = torch.autograd.grad(loss, lc)
    for t, ref_g, bl, n in zip((x2, w2, b2), want, base, ("dx", "dweight", "dbias")):
        check_grad(t.grad, ref_g, bl, dtype, n)
