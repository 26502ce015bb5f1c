"""`flashscan.torch`'s eager autograd path: the lean plans (pytest; CPU tests need torch only).

CPU tests: CPU torch tensors look like cuda:0 tensors (as in test_torch_plans) and the native
entries are stubs that record their arguments and write a distinct constant into every output
buffer. A training step is made twice with the same tensors: the first goes through the
general path (every check) and records a lean plan, the second through the plan. The native
calls must be the same (pointers named by the tensor they belong to), the gradients must be
the buffers the backward wrote, a changed signature must not reuse a stale plan, and inputs
that need no gradient get None.

GPU tests (`gpu` marker): the lean path's gradients against the general path's and the float64
reference, repeated calls (plan hits) and changed signatures.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from flashscan import _backend, attention, scan

torch = pytest.importorskip("torch")

from test_torch_plans import FakeReplay, fake_cuda, forget_plans  # noqa: E402

import flashscan.torch as fst  # noqa: E402

bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
_DT = {"float32": f32, "bfloat16": bf, "float16": f16, "float64": torch.float64}
# the outputs of each native entry (argument positions) that the stub fills
_OUTPUTS = {
    "selective_scan_fwd": (9, 10),
    "selective_scan_bwd": tuple(range(12, 21)),
    "flash_attn_fwd": (3, 4),
    "flash_attn_bwd": (6, 7, 8),
}


def _fill(desc: tuple, value: float) -> None:
    """Write `value` into the CPU memory a descriptor names."""
    ptr, shape, strides, dtype = desc[:4]
    dt = _DT[dtype]
    span = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    buf = (ctypes.c_char * (span * dt.itemsize)).from_address(ptr)
    torch.frombuffer(buf, dtype=dt, count=span).as_strided(tuple(shape), tuple(strides)).fill_(
        value
    )


class Native:
    """Records each call (positional args, then keyword args) and fills its outputs with
    1, 2, 3... in argument order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        def f(*args: Any, **kw: Any) -> Any:
            if kw.get("replay"):
                return FakeReplay(self, name, args, kw)
            self.calls.append((name, args + tuple(sorted(kw.items()))))
            for i, pos in enumerate(_OUTPUTS.get(name, ())):
                if args[pos] is not None:
                    _fill(args[pos], float(i + 1))

        return f


def forget() -> None:
    forget_plans()
    fst._ATTN_LEAN.clear()
    fst._SCAN_LEAN.clear()
    fst._ATTN_LAST = fst._SCAN_LAST = (None, None)


@pytest.fixture
def native() -> Any:
    undo = fake_cuda()
    rec = Native()
    saved = (attention._native, scan._native, fst._native)
    attention._native = scan._native = fst._native = rec
    forget()
    yield rec
    forget()  # plans keyed on CPU devices must never outlive the fake
    attention._native, scan._native, fst._native = saved
    undo()


def general_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the general functions called (the forward's and the backward's)."""
    seen: list[str] = []
    for mod, name in (
        (attention, "_flash_attn_any"),
        (scan, "_scan_any"),
        (fst, "_attn_bwd_impl"),
        (fst, "_scan_bwd_impl"),
    ):
        real = getattr(mod, name)

        def wrap(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(mod, name, wrap)
    return seen


def named(calls: list[tuple[str, tuple]], known: dict[int, str]) -> list[tuple[str, tuple]]:
    """The calls with each descriptor's pointer replaced by the name of the tensor it belongs
    to (`known`), or by 'new<i>' in order of first appearance in its call (outputs, saved
    states: freed buffers are reused, so new pointers are only told apart within a call)."""

    def name_of(x: Any, fresh: dict[int, str]) -> Any:
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str):  # a keyword
            return (x[0], name_of(x[1], fresh))
        if isinstance(x, tuple) and len(x) == 6 and isinstance(x[1], tuple):
            ptr = x[0]
            label = known.get(ptr) or fresh.setdefault(ptr, f"new{len(fresh)}")
            return (label, tuple(x[1]), tuple(x[2]), x[3], x[4], x[5])
        return x

    out = []
    for n, args in calls:
        fresh: dict[int, str] = {}
        out.append((n, tuple(name_of(a, fresh) for a in args)))
    return out


def step(
    rec: Native, fn: Any, leaves: list[Any], grad_outputs: Any
) -> tuple[list[tuple[str, tuple]], tuple[Any, ...]]:
    """One training step: (the native calls it made, the gradients of `leaves`)."""
    start = len(rec.calls)
    outs = fn()
    grads = torch.autograd.grad(outs, leaves, grad_outputs)
    return rec.calls[start:], grads


def check_twice(
    rec: Native,
    seen: list[str],
    fn: Any,
    leaves: list[Any],
    grad_outputs: Any,
    known: dict[int, str],
) -> tuple[Any, ...]:
    """The step through the general path, then through the lean plan: the same native calls
    and the same gradients. Returns the gradients."""
    seen.clear()
    c1, g1 = step(rec, fn, leaves, grad_outputs)
    assert seen, "the first call of a signature must take the general path"
    seen.clear()
    c2, g2 = step(rec, fn, leaves, grad_outputs)
    assert not seen, f"the second call must take the lean plan, took {seen}"
    assert [n for n, _ in c1] == [n for n, _ in c2] and len(c1) == 2
    assert named(c1, known) == named(c2, known)
    # the third step: ops with native replay plans launch through them (the fake replays the
    # descriptor call it stands for), with the same arguments and gradients
    c3, g3 = step(rec, fn, leaves, grad_outputs)
    assert not seen
    assert named(c3, known) == named(c2, known)
    for a, b, c in zip(g1, g2, g3):
        assert (a is None) == (b is None) == (c is None)
        if a is not None:
            for x in (b, c):
                assert a.dtype == x.dtype and a.shape == x.shape and a.stride() == x.stride()
                assert torch.equal(a, x)
    return g3


def rnd(*shape: int, dtype: Any = bf) -> Any:
    return torch.randn(*shape).to(dtype)


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------


def scan_case(
    b: int = 2, dim: int = 8, L: int = 13, n: int = 4, dtype: Any = bf, bcdt: Any = bf, **opt: Any
) -> dict[str, Any]:
    a: dict[str, Any] = {
        "u": rnd(b, dim, L, dtype=dtype),
        "delta": rnd(b, dim, L, dtype=dtype),
        "A": -torch.rand(dim, n),
        "B": rnd(b, n, L, dtype=bcdt) if not opt.get("fixed") else torch.randn(dim, n),
        "C": rnd(b, n, L, dtype=bcdt) if not opt.get("fixed") else torch.randn(dim, n),
    }
    if opt.get("extras"):
        a.update(D=torch.randn(dim), z=rnd(b, dim, L, dtype=dtype), delta_bias=torch.rand(dim))
    if opt.get("init"):
        a["initial_state"] = torch.randn(b, dim, n)
    return a


def scan_leaves(a: dict[str, Any], grad: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Leaf copies of the inputs (strided views kept strided), requiring grad if in `grad`."""
    return {
        k: (t.clone() if t.is_contiguous() else t.detach()).requires_grad_(
            grad is None or k in grad
        )
        for k, t in a.items()
        if t is not None
    }


def known_of(tensors: dict[str, Any]) -> dict[int, str]:
    return {t.data_ptr(): k for k, t in tensors.items()}


@pytest.mark.parametrize(
    "opt",
    [
        {},
        {"extras": True},
        {"extras": True, "init": True, "last": True},
        {"fixed": True, "extras": True, "bcdt": f32},
        {"dtype": f32, "bcdt": f32, "init": True},
        {"dtype": f16, "bcdt": f16, "extras": True, "L": 600},  # 2 saved chunk states
        {"extras": True, "L": 520, "last": True, "only_last": True},  # dout None
    ],
)
@pytest.mark.parametrize("softplus", [False, True])
def test_scan_lean_passes_the_general_paths_arguments(
    native: Native, monkeypatch: Any, opt: dict, softplus: bool
) -> None:
    seen = general_calls(monkeypatch)
    kw = {k: opt[k] for k in ("b", "dim", "L", "n", "dtype", "bcdt") if k in opt}
    a = scan_case(**kw, fixed=opt.get("fixed"), extras=opt.get("extras"), init=opt.get("init"))
    leaves = scan_leaves(a)
    last = bool(opt.get("last"))

    def fn() -> Any:
        r = fst.selective_scan_fn(**leaves, delta_softplus=softplus, return_last_state=last)
        return (r[1],) if opt.get("only_last") else r

    y = fn()
    gout = tuple(torch.randn_like(t) for t in (y if isinstance(y, tuple) else (y,)))
    native.calls.clear()
    forget()
    known = known_of(leaves) | {t.data_ptr(): f"grad_out{i}" for i, t in enumerate(gout)}
    grads = check_twice(native, seen, fn, list(leaves.values()), gout, known)
    # the gradients are what the backward wrote (1, 2, ... in du, ddelta, dA, dB, dC, dD, dz,
    # ddelta_bias, dinitial_state order), in their inputs' dtypes
    order = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
    for name, g in zip(leaves, grads):
        assert g.dtype == leaves[name].dtype and g.shape == leaves[name].shape
        assert torch.all(g == float(order.index(name) + 1)), name
    fwd, bwd = named(native.calls[-2:], known)
    assert fwd[0] == "selective_scan_fwd" and bwd[0] == "selective_scan_bwd"
    # dB / dC are asked for in B's / C's dtype (the kernels round their float32 sums once):
    # the step converts nothing itself
    raw = native.calls[-1][1]
    for pos, name in ((15, "B"), (16, "C")):
        assert raw[pos][3] == str(leaves[name].dtype).removeprefix("torch."), name
    L = a["u"].shape[2]
    saved = [x for x in native.calls[-2][1] if isinstance(x, tuple) and x[0] == "saved_states"]
    if L > 256:  # the forward kept the chunk states and the backward reads them
        assert saved and saved[0][1][1][2] == (L + 255) // 256 - 1
        assert native.calls[-1][1][10] == saved[0][1]
    else:
        assert not saved and bwd[1][10] is None
    assert (fwd[1][10] is None) == (not last)  # the last state only when asked for
    if not last:
        assert bwd[1][11] is None  # nothing reached a last state: no zero-filled dlast_state
    if opt.get("only_last"):
        assert bwd[1][9][0] not in ("grad_out0",)  # dout: zeros made for the kernel
        assert bwd[1][11][0] == "grad_out0"
    else:
        assert bwd[1][9][0] == "grad_out0"
    assert fwd[1][11] is softplus and bwd[1][21] is softplus


@pytest.mark.parametrize(
    "change",
    ["seqlen", "dtype", "strides", "bc_dtype", "no_extras", "softplus", "last", "batch"],
)
def test_scan_changed_signature_takes_no_stale_plan(
    native: Native, monkeypatch: Any, change: str
) -> None:
    """After the base signature's plan is hot, a changed call passes what the general path
    passes for it (when its signature is new) and, repeated, takes its own plan."""
    seen = general_calls(monkeypatch)
    base = scan_case(extras=True)
    sp, last = True, False
    if change == "seqlen":
        other = scan_case(extras=True, L=14)
    elif change == "batch":
        other = scan_case(extras=True, b=3)
    elif change == "dtype":
        other = scan_case(extras=True, dtype=f16, bcdt=f16)
    elif change == "bc_dtype":
        other = scan_case(extras=True, bcdt=f32)
    elif change == "no_extras":
        other = scan_case()
    elif change == "strides":  # u a view with a padded channel stride
        other = dict(base)
        other["u"] = rnd(2, 8, 20)[..., :13]
    else:
        other = dict(base)
        sp, last = (False, False) if change == "softplus" else (True, True)

    def run(a: dict[str, Any], sp: bool, last: bool) -> tuple[Any, ...]:
        leaves = scan_leaves(a)
        y = fst.selective_scan_fn(**leaves, delta_softplus=sp, return_last_state=last)
        ys = y if isinstance(y, tuple) else (y,)
        gout = tuple(torch.ones_like(t) for t in ys)
        start = len(native.calls)
        grads = torch.autograd.grad(ys, list(leaves.values()), gout)
        calls = native.calls[start - 1 :]
        known = known_of(leaves) | {t.data_ptr(): f"grad_out{i}" for i, t in enumerate(gout)}
        return named(calls, known), grads

    forget()
    fresh, fresh_grads = run(other, sp, last)  # alone: the general path
    forget()
    run(base, True, False)
    run(base, True, False)  # the base plan is hot
    seen.clear()
    after, after_grads = run(other, sp, last)
    assert after == fresh
    if change in ("softplus", "last"):  # same signature: the flags reach the lean call
        assert not seen
    else:
        assert "_scan_any" in seen  # a new signature: checked by the general path
    seen.clear()
    again, _ = run(other, sp, last)
    assert again == fresh and not seen
    for a, b in zip(fresh_grads, after_grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "grad",
    [("u",), ("B",), ("A", "D"), ("C", "delta_bias", "initial_state"), ("z", "delta")],
)
def test_scan_inputs_without_grad_get_none(native: Native, grad: tuple[str, ...]) -> None:
    a = scan_case(extras=True, init=True)
    for attempt in ("general", "lean"):
        leaves = scan_leaves(a, grad)
        y = fst.selective_scan_fn(**leaves, delta_softplus=True)
        assert (fst._SCAN_LAST[1] is not None) == (attempt == "lean")
        got = y.grad_fn.apply(torch.ones_like(y))
        assert len(got) == 12 and all(g is None for g in got[9:])
        for name, g in zip(leaves, got):
            assert (g is None) == (name not in grad), (attempt, name)
            if g is not None:
                assert g.dtype == leaves[name].dtype


def test_scan_backward_reads_fresh_pointers_and_checks_the_signature(native: Native) -> None:
    a = scan_case(extras=True)
    for _ in range(2):  # the plan is hot
        leaves = scan_leaves(a)
        y = fst.selective_scan_fn(**leaves)
        torch.autograd.grad(y, list(leaves.values()), torch.ones_like(y))
    # storage swapped after the forward (as FSDP does): the backward sees the new pointer
    leaves = scan_leaves(a)
    y = fst.selective_scan_fn(**leaves)
    leaves["u"].data = leaves["u"].data.clone()
    torch.autograd.grad(y, list(leaves.values()), torch.ones_like(y))
    assert native.calls[-1][1][0][0] == leaves["u"].data_ptr()
    # metadata swapped: the general backward describes the tensor as it is now
    leaves = scan_leaves(a)
    y = fst.selective_scan_fn(**leaves)
    leaves["z"].data = rnd(2, 8, 26)[..., ::2]
    torch.autograd.grad(y, list(leaves.values()), torch.ones_like(y))
    assert tuple(native.calls[-1][1][6][2]) == leaves["z"].stride()


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def attn_case(
    b: int = 2, sq: int = 7, sk: int = 7, h: int = 4, hk: int = 4, d: int = 16, dtype: Any = bf
) -> list[Any]:
    return [
        rnd(b, sq, h, d, dtype=dtype),
        rnd(b, sk, hk, d, dtype=dtype),
        rnd(b, sk, hk, d, dtype=dtype),
    ]


@pytest.mark.parametrize(
    "shape,opts",
    [
        ({}, {}),
        ({}, {"causal": True}),
        ({"hk": 2, "sk": 9}, {"causal": True, "return_lse": True}),
        ({"hk": 1, "dtype": f16}, {"window_size": (3, 1), "softcap": 2.0, "softmax_scale": 0.3}),
        ({"dtype": f32}, {"deterministic": True}),
    ],
)
def test_attention_lean_passes_the_general_paths_arguments(
    native: Native, monkeypatch: Any, shape: dict, opts: dict
) -> None:
    seen = general_calls(monkeypatch)
    leaves = [t.requires_grad_() for t in attn_case(**shape)]

    def fn() -> Any:
        r = fst.flash_attn_func(*leaves, **opts)
        return r[0] if opts.get("return_lse") else r

    gout = torch.randn_like(leaves[0])
    known = {t.data_ptr(): n for t, n in zip(leaves, "qkv")} | {gout.data_ptr(): "dout"}
    grads = check_twice(native, seen, fn, leaves, gout, known)
    for i, (g, t) in enumerate(zip(grads, leaves)):
        assert g.dtype == t.dtype and g.shape == t.shape and torch.all(g == float(i + 1))
    fwd, bwd = named(native.calls[-2:], known)
    # the backward reads the forward's out and lse
    raw_f, raw_b = native.calls[-2][1], native.calls[-1][1]
    assert raw_b[4] == raw_f[3] and raw_b[5] == raw_f[4] and bwd[1][0][0] == "dout"
    assert bwd[1][13] is bool(opts.get("deterministic", False))


@pytest.mark.parametrize("change", ["seqlen", "dtype", "gqa", "strides", "causal"])
def test_attention_changed_signature_takes_no_stale_plan(
    native: Native, monkeypatch: Any, change: str
) -> None:
    seen = general_calls(monkeypatch)
    base = attn_case()
    causal = False
    if change == "seqlen":
        other = attn_case(sq=8, sk=8)
    elif change == "dtype":
        other = attn_case(dtype=f16)
    elif change == "gqa":
        other = attn_case(hk=2)
    elif change == "strides":  # q a view of a packed qkv
        other = list(rnd(2, 7, 3, 4, 16).unbind(2))
    else:
        other, causal = base, True

    def run(ts: list[Any], causal: bool) -> tuple[Any, ...]:
        leaves = [t.detach().clone() if change != "strides" else t.detach() for t in ts]
        leaves = [t.requires_grad_() for t in leaves]
        y = fst.flash_attn_func(*leaves, causal=causal)
        start = len(native.calls)
        gout = torch.ones_like(y)
        grads = torch.autograd.grad(y, leaves, gout)
        known = {t.data_ptr(): n for t, n in zip(leaves, "qkv")} | {gout.data_ptr(): "dout"}
        return named(native.calls[start - 1 :], known), grads

    forget()
    fresh, _ = run(other, causal)
    forget()
    run(base, False)
    run(base, False)
    seen.clear()
    after, _ = run(other, causal)
    assert after == fresh
    assert ("_flash_attn_any" in seen) == (change != "causal")
    seen.clear()
    again, _ = run(other, causal)
    assert again == fresh and not seen


@pytest.mark.parametrize("grad", [(0,), (1, 2), (0, 2)])
def test_attention_inputs_without_grad_get_none(native: Native, grad: tuple[int, ...]) -> None:
    base = attn_case()
    for attempt in ("general", "lean"):
        leaves = [t.clone().requires_grad_(i in grad) for i, t in enumerate(base)]
        y = fst.flash_attn_func(*leaves, causal=True)
        assert (fst._ATTN_LAST[1] is not None) == (attempt == "lean")
        got = y.grad_fn.apply(torch.ones_like(y))
        assert len(got) == 9 and all(g is None for g in got[3:])
        for i, g in enumerate(got[:3]):
            assert (g is None) == (i not in grad), (attempt, i)


def test_unusable_device_leaves_the_lean_path(native: Native, monkeypatch: Any) -> None:
    """A plan is only used while its device is usable: otherwise the general path decides
    (here the fallback policy raises)."""
    seen = general_calls(monkeypatch)
    leaves = [t.requires_grad_() for t in attn_case()]
    for _ in range(2):
        torch.autograd.grad(fst.flash_attn_func(*leaves), leaves, torch.ones_like(leaves[0]))
    monkeypatch.setattr(_backend, "_usable", frozenset())
    monkeypatch.setenv("FLASHSCAN_FALLBACK", "error")
    _backend._policy = None  # type: ignore[attr-defined]
    seen.clear()
    with pytest.raises(Exception):  # noqa: B017 - whichever error the policy raises
        fst.flash_attn_func(*leaves)
    assert seen == ["_flash_attn_any"]


# ---------------------------------------------------------------------------------------------
# GPU: the lean path's gradients against the general path's and the float64 reference
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_plans() -> Any:
    forget()
    yield
    forget()


def _scan_grads_gpu(a: dict[str, Any], last: bool) -> tuple[Any, ...]:
    leaves = {k: t.clone().requires_grad_() for k, t in a.items()}
    r = fst.selective_scan_fn(**leaves, delta_softplus=True, return_last_state=last)
    ys = r if isinstance(r, tuple) else (r,)
    g = torch.Generator(device="cuda").manual_seed(5)
    gout = tuple(torch.randn(t.shape, device="cuda", generator=g).to(t.dtype) for t in ys)
    return torch.autograd.grad(ys, list(leaves.values()), gout)


@pytest.mark.gpu
@pytest.mark.parametrize("L,last", [(60, False), (61, True), (600, False)])
def test_scan_lean_grads_match_general_and_reference_gpu(
    fresh_plans: Any, rule: Any, L: int, last: bool
) -> None:
    from test_scan_gpu import scan_inputs, scan_ref

    x = scan_inputs(2, 64, L, 16, torch.bfloat16)
    a = {k: x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")}
    general = _scan_grads_gpu(a, last)  # the signature's first call
    assert fst._SCAN_LEAN, "the general path did not record a lean plan"
    lean = _scan_grads_gpu(a, last)
    again = _scan_grads_gpu(a, last)
    for name, g0, g1, g2 in zip(a, general, lean, again):
        # dB/dC/dA... are float32 sums with atomics: equal up to summation order
        rule.same_up_to_order(g1, g0, name=f"d{name} lean vs general")
        rule.same_up_to_order(g2, g1, name=f"d{name} again vs lean")
    leaves64 = {k: t.detach().double().requires_grad_() for k, t in a.items()}
    r64 = scan_ref(**leaves64, delta_softplus=True)
    ys64 = r64 if last else (r64[0],)
    g = torch.Generator(device="cuda").manual_seed(5)
    gout = [torch.randn(t.shape, device="cuda", generator=g) for t in ys64]
    gout = [t.to(torch.bfloat16).double() if i == 0 else t.double() for i, t in enumerate(gout)]
    ref = torch.autograd.grad(ys64, list(leaves64.values()), gout)
    for name, got, r in zip(a, lean, ref):
        scale = float(r.abs().max())
        assert torch.isfinite(got).all(), name
        err = float((got.double() - r).abs().max())
        assert err <= 2e-2 * max(scale, 1.0), f"d{name}: {err} vs scale {scale}"
    # a changed signature (seqlen + 1) after the hot plan: the general path, the right grads
    x2 = scan_inputs(2, 64, L + 1, 16, torch.bfloat16)
    a2 = {k: x2[k] for k in a}
    forget()
    alone = _scan_grads_gpu(a2, last)
    forget()
    _scan_grads_gpu(a, last)
    _scan_grads_gpu(a, last)
    after = _scan_grads_gpu(a2, last)
    for name, g0, g1 in zip(a, alone, after):
        rule.same_up_to_order(g1, g0, name=f"d{name} after the hot plan vs alone")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case", [(32, 60, 60, 8, 8, 64), (1, 60, 60, 8, 2, 64), (2, 33, 77, 4, 1, 128)]
)
def test_attention_lean_grads_match_general_gpu(fresh_plans: Any, case: tuple) -> None:
    b, sq, sk, h, hk, d = case
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (
        torch.randn(s, device="cuda", generator=g).to(torch.bfloat16)
        for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d))
    )
    dout = torch.randn(b, sq, h, d, device="cuda", generator=g).to(torch.bfloat16)

    def grads(det: bool) -> tuple[Any, ...]:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fst.flash_attn_func(*leaves, causal=True, deterministic=det)
        return torch.autograd.grad(out, leaves, dout)

    general = grads(True)
    lean = grads(True)
    for g0, g1 in zip(general, lean):
        assert torch.equal(g0, g1), "deterministic: the lean path must give the same bits"
    for g0, g1 in zip(grads(False), grads(False)):
        torch.testing.assert_close(g1.float(), g0.float(), atol=2e-2, rtol=2e-2)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    rep = h // hk
    kk, vv = (t.repeat_interleave(rep, dim=2) for t in leaves64[1:])
    s = torch.einsum("bqhd,bkhd->bhqk", leaves64[0], kk) / d**0.5
    mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq)
    o = torch.einsum("bhqk,bkhd->bqhd", s.masked_fill(~mask, float("-inf")).softmax(-1), vv)
    ref = torch.autograd.grad(o, leaves64, dout.double())
    for got, r in zip(lean, ref):
        err = float((got.double() - r).abs().max())
        assert err <= 2e-2 * max(float(r.abs().max()), 1.0)
