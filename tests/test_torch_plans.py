"""The torch plan fast path (pytest; torch installed, no GPU needed; skipped without torch).

CPU torch tensors are made to look like cuda:0 tensors (tools/bench_python_layer.fake_cuda)
and `_native` records its arguments. Every call is made twice: the first goes through the
general path (which records the plan), the second through the plan; the native arguments and
the returned tensors must be the same, and bad input must raise the same exception with the
same message either way.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import _backend, _checks, _frameworks, attention, kvcache, scan, ssd, varlen

torch = pytest.importorskip("torch")


def fake_cuda() -> Any:
    """CPU tensors look like cuda:0 tensors to the general path (as in
    tools/bench_python_layer.py); returns an undo."""
    saved = {k: torch.Tensor.__dict__.get(k) for k in ("is_cuda", "get_device")}
    torch.Tensor.is_cuda = True
    torch.Tensor.get_device = int  # int() == 0
    h = _frameworks.handler_of(torch.empty(1), "t")
    saved_stream = h.__dict__.get("current_stream")
    h.current_stream = int
    saved_usable = _backend._usable
    _backend._usable = frozenset({0})

    def undo() -> None:
        for k, v in saved.items():
            if v is None:
                if k in torch.Tensor.__dict__:
                    delattr(torch.Tensor, k)
            else:
                setattr(torch.Tensor, k, v)
        h.current_stream = saved_stream
        _backend._usable = saved_usable

    return undo


class FakeReplay:
    """What a native `replay=True` call returns, faked: `launch(ptrs..., stream)` rebuilds the
    planned call's arguments with these pointers (each descriptor's pointer replaced, in
    argument order: every tensor argument, then the keyword `saved_states` of the forward)
    and makes that call on `target`, so a replayed call is recorded (and its outputs filled)
    exactly as the descriptor call it stands for: a pointer passed in the wrong place shows
    as a wrong argument."""

    def __init__(self, target: Any, name: str, args: tuple, kw: dict[str, Any]) -> None:
        self.target, self.name, self.args, self.kw = target, name, args, kw

    def launch(self, *ptrs: Any) -> None:
        *ptrs, stream = ptrs
        # every tensor argument (a descriptor or None); the last argument is the stream
        slots = [i for i, a in enumerate(self.args[:-1]) if a is None or isinstance(a, tuple)]
        keys = ["saved_states"] if self.name == "selective_scan_fwd" else []
        assert len(ptrs) == len(slots) + len(keys), (self.name, len(ptrs))
        args = list(self.args)
        for i, p in zip(slots, ptrs):
            args[i] = self._with(args[i], p)
        kw = {k: v for k, v in self.kw.items() if k != "replay"}
        for k, p in zip(keys, ptrs[len(slots) :]):
            kw[k] = self._with(kw.get(k), p)
            if kw[k] is None:
                del kw[k]
        args[-1] = stream  # the planning call passed no stream: the launch's stands there
        getattr(self.target, self.name)(*args, **kw)

    @staticmethod
    def _with(desc: Any, ptr: int) -> Any:
        if desc is None:
            assert ptr == 0, "a pointer for an absent argument"
            return None
        assert ptr != 0, "a null pointer for a present argument"
        return (ptr, *desc[1:])


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        def f(*args: Any, **kw: Any) -> Any:
            if kw.get("replay"):
                return FakeReplay(self, name, args, kw)
            self.calls.append((name, args + tuple(sorted(kw.items()))))
            return None

        return f


def norm(a: Any) -> Any:
    if isinstance(a, tuple) and len(a) == 6 and isinstance(a[1], tuple):
        return (a[0], tuple(a[1]), tuple(a[2]), a[3], a[4], a[5])
    return a


def forget_plans() -> None:
    for d in (attention._PLANS, kvcache._PLANS, scan._SCAN_PLANS, scan._SSU_PLANS, ssd._PLANS):
        d.clear()
    attention._LAST = kvcache._LAST = scan._SCAN_LAST = scan._SSU_LAST = (None, None)
    fst = sys.modules.get("flashscan.torch")
    if fst is not None:  # flashscan.torch's lean plans (grad-requiring calls route there)
        fst._ATTN_LEAN.clear()
        fst._SCAN_LEAN.clear()
        fst._ATTN_LAST = fst._SCAN_LAST = (None, None)


@pytest.fixture
def fake() -> Any:
    undo = fake_cuda()
    rec = Recorder()
    saved = (attention._native, kvcache._native, scan._native, varlen._native, ssd._native)
    attention._native = kvcache._native = scan._native = varlen._native = ssd._native = rec
    forget_plans()
    yield rec
    # the fake's plans are keyed on CPU devices: never leave them for later tests
    forget_plans()
    attention._native, kvcache._native, scan._native, varlen._native, ssd._native = saved
    undo()


def general_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    for mod, name in (
        (attention, "_flash_attn_any"),
        (scan, "_scan_any"),
        (scan, "_state_update_any"),
        (kvcache, "_on_gpu"),
        (ssd, "ssd_any"),
    ):
        real = getattr(mod, name)

        def wrap(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(mod, name, wrap)
    return seen


def outs(r: Any) -> list[Any]:
    rs = r if isinstance(r, tuple) else (r,)
    return [
        (type(t), tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad, t.is_contiguous())
        for t in rs
    ]


def twice(rec: Recorder, seen: list[str], fn: Any, n_out: int) -> None:
    """fn() twice: general path then plan; native args (outputs' pointers aside) must match."""
    _frameworks.handler_of(torch.nn.Parameter(torch.zeros(1)), "p")  # knows the type
    forget_plans()
    seen.clear()
    r1 = fn()
    assert seen, "first call must take the general path"
    seen.clear()
    r2 = fn()
    assert not seen, "second call must take the plan"
    (n1, a1), (n2, a2) = rec.calls[-2], rec.calls[-1]
    assert n1 == n2
    a1 = [norm(x) for x in a1]
    a2 = [norm(x) for x in a2]
    assert len(a1) == len(a2)
    # outputs are newly allocated (their pointers differ) unless out= was given
    r1s = r1 if isinstance(r1, tuple) else (r1,)
    new_ptrs = {t.data_ptr() for t in r1s}
    for x, y in zip(a1, a2):
        if isinstance(x, tuple) and x[0] in new_ptrs:
            assert x[1:] == y[1:]
        else:
            assert x == y, (x, y)
            assert type(x) is type(y)
    assert outs(r1) == outs(r2)
    assert len(outs(r1)) == n_out
    # a third call: ops with a native replay plan launch through it, with the same arguments
    r3 = fn()
    (n3, a3) = rec.calls[-1]
    assert n3 == n2 and len(a3) == len(a2)
    new_ptrs = {t.data_ptr() for t in (r2 if isinstance(r2, tuple) else (r2,))}
    for x, y in zip([norm(x) for x in a3], a2):
        if isinstance(y, tuple) and y[0] in new_ptrs:
            assert x[1:] == y[1:]
        else:
            assert x == y, (x, y)
    assert outs(r3) == outs(r2)


bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32


def rnd(*shape: int, dtype: Any = bf) -> Any:
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("dtype", [bf, f16, f32])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"causal": True},
        {"causal": True, "return_lse": True},
        {"window_size": (3, 1), "softcap": 2.0, "softmax_scale": 0.3},
        {"window_size": [4, 0], "causal": __import__("numpy").bool_(True)},
        {"softmax_scale": 1, "softcap": 0},
    ],
)
def test_attention_plan(fake: Recorder, monkeypatch: Any, dtype: Any, opts: dict) -> None:
    seen = general_calls(monkeypatch)
    q, k, v = (
        rnd(2, 7, 4, 16, dtype=dtype),
        rnd(2, 9, 2, 16, dtype=dtype),
        rnd(2, 9, 2, 16, dtype=dtype),
    )
    n = 2 if opts.get("return_lse") else 1
    twice(fake, seen, lambda: flashscan.flash_attn_func(q, k, v, **opts), n)
    out = torch.empty_like(q)
    twice(fake, seen, lambda: flashscan.flash_attn_func(q, k, v, out=out, **opts), n)
    # non-contiguous (but headdim-contiguous) q and parameters
    qt = rnd(2, 4, 7, 16, dtype=dtype).transpose(1, 2)
    kp = torch.nn.Parameter(k.clone(), requires_grad=False)
    twice(fake, seen, lambda: flashscan.flash_attn_func(qt, kp, v, **opts), n)


def test_attention_bad_options_same_errors(fake: Recorder, monkeypatch: Any) -> None:
    q, k, v = rnd(1, 5, 2, 8), rnd(1, 5, 2, 8), rnd(1, 5, 2, 8)
    bad = [
        {"causal": "yes"},
        {"return_lse": "no"},
        {"window_size": (-2, 0)},
        {"window_size": "ab"},
        {"window_size": (1.5, 0)},
        {"softcap": -1.0},
        {"softcap": float("nan")},
        {"softmax_scale": "x"},
        {"softmax_scale": float("inf")},
    ]
    msgs = []
    for b in bad:  # general path (no plan yet for this signature... recorded after the 1st)
        with pytest.raises(Exception) as e:
            flashscan.flash_attn_func(q, k, v, **b)
        msgs.append((type(e.value), str(e.value)))
    assert not attention._PLANS
    flashscan.flash_attn_func(q, k, v)  # records the plan
    assert attention._PLANS
    for b, (t, m) in zip(bad, msgs):
        with pytest.raises(t) as e:
            flashscan.flash_attn_func(q, k, v, **b)
        assert str(e.value) == m


def test_attention_metadata_change_misses(fake: Recorder, monkeypatch: Any) -> None:
    seen = general_calls(monkeypatch)
    q, k, v = rnd(1, 5, 2, 8), rnd(1, 5, 2, 8), rnd(1, 5, 2, 8)
    flashscan.flash_attn_func(q, k, v)
    flashscan.flash_attn_func(q, k, v)
    seen.clear()
    q.resize_(1, 5, 2, 16)  # same object, new shape: headdim mismatch now
    with pytest.raises(ValueError, match="headdim"):
        flashscan.flash_attn_func(q, k, v)
    assert seen
    k2 = k.to(f16)
    with pytest.raises(TypeError, match="k: dtype float16"):
        flashscan.flash_attn_func(rnd(1, 5, 2, 8), k2, v)
    vv = rnd(1, 5, 2, 16)[..., ::2]
    with pytest.raises(ValueError, match="v: its last dimension"):
        flashscan.flash_attn_func(rnd(1, 5, 2, 8), k, vv)
    with pytest.raises(ValueError, match="out: expected shape"):
        flashscan.flash_attn_func(k, k, v, out=rnd(1, 5, 2, 16))


def test_unusable_device_falls_back(fake: Recorder, monkeypatch: Any) -> None:
    q, k, v = rnd(1, 5, 2, 8, dtype=f32), rnd(1, 5, 2, 8, dtype=f32), rnd(1, 5, 2, 8, dtype=f32)
    flashscan.flash_attn_func(q, k, v)
    flashscan.flash_attn_func(q, k, v)
    n = len(fake.calls)
    monkeypatch.setattr(_backend, "_usable", frozenset())
    monkeypatch.setattr(_backend, "_policy", "warn")
    monkeypatch.setattr(_backend, "_warned", False)
    # the fake's tensors are really CPU tensors: to_host works; from_host gives CPU tensors
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flashscan.flash_attn_func(q, k, v)
    assert len(fake.calls) == n  # no native call
    fw = [w for w in caught if issubclass(w.category, flashscan.FallbackWarning)]
    assert len(fw) == 1 and fw[0].filename == __file__
    if _backend.native is not None and _backend.native.backend_status()["available"]:
        return  # a real GPU here: recomputing the status finds it usable, as it should
    monkeypatch.setattr(_backend, "_usable", None)  # status not computed: general path
    monkeypatch.setattr(_backend, "_status", None)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        flashscan.flash_attn_func(q, k, v)
    assert len(fake.calls) == n


def kvcache_call(append: bool, rotary: bool, dtype: Any = bf) -> Any:
    """A decode step's call (b 2, cache 32, nheads 4 over nheads_k 2, headdim 16); returns
    (call(**options), the input tensors' pointers)."""
    b, cap, hk, d = 2, 32, 2, 16
    q = rnd(b, 1, 4, d, dtype=dtype)
    kc, vc = rnd(b, cap, hk, d, dtype=dtype), rnd(b, cap, hk, d, dtype=dtype)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    extra: dict[str, Any] = {}
    if append:
        extra.update(k=rnd(b, 1, hk, d, dtype=dtype), v=rnd(b, 1, hk, d, dtype=dtype))
    if rotary:
        extra.update(rotary_cos=rnd(cap, d // 2, dtype=f32), rotary_sin=rnd(cap, d // 2, dtype=f32))
    inputs = {t.data_ptr() for t in (q, kc, vc, lens, *extra.values())}

    def call(**opts: Any) -> Any:
        return flashscan.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **extra, **opts)

    return call, inputs


@pytest.mark.parametrize("append,rotary", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"causal": True, "return_lse": True},
        {"window_size": (3, 0), "softcap": 2.0, "softmax_scale": 0.3, "num_splits": 2},
        {
            "causal": __import__("numpy").bool_(True),
            "window_size": [4, 1],
            "rotary_interleaved": 0,
            "num_splits": __import__("numpy").int64(1),
            "softmax_scale": 1,
        },
    ],
)
def test_kvcache_plan(
    fake: Recorder, monkeypatch: Any, append: bool, rotary: bool, opts: dict
) -> None:
    """The decode loop's plan: the second call of a signature makes the same native calls (the
    arrays it allocates aside) as the general path's first, and returns the same outputs."""
    seen = general_calls(monkeypatch)
    call, inputs = kvcache_call(append, rotary)
    forget_plans()
    fake.calls.clear()
    r1 = call(**opts)
    assert seen == ["_on_gpu"], "first call must take the general path"
    first = list(fake.calls)
    assert [n for n, _ in first] == (["kvcache_append"] if append else []) + ["flash_attn_kvcache"]
    seen.clear()
    fake.calls.clear()
    r2 = call(**opts)
    assert not seen, "second call must take the plan"
    assert [n for n, _ in fake.calls] == [n for n, _ in first]
    for (_, a1), (_, a2) in zip(first, fake.calls):
        assert len(a1) == len(a2)
        for x, y in zip(map(norm, a1), map(norm, a2)):
            if isinstance(x, tuple) and len(x) == 6 and x[0] not in inputs:
                assert x[1:] == y[1:]  # allocated by the call: out, lse, rotated q
            else:
                assert x == y, (x, y)
                assert type(x) is type(y)
    assert outs(r1) == outs(r2)


def test_kvcache_bad_options_same_errors(fake: Recorder) -> None:
    call, _ = kvcache_call(True, False)
    bad = [
        {"causal": "yes"},
        {"return_lse": "no"},
        {"window_size": (-2, 0)},
        {"window_size": (1.5, 0)},
        {"softcap": -1.0},
        {"softmax_scale": float("inf")},
        {"rotary_interleaved": "x"},
        {"num_splits": -1},
        {"num_splits": 1.5},
        {"num_splits": True},
    ]
    msgs = []
    for b in bad:
        with pytest.raises(Exception) as e:
            call(**b)
        msgs.append((type(e.value), str(e.value)))
    assert not kvcache._PLANS
    call()  # records the plan
    assert kvcache._PLANS
    for b, (t, m) in zip(bad, msgs):
        with pytest.raises(t) as e:
            call(**b)
        assert str(e.value) == m


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("given_out", [False, True])
def test_varlen_gpu_call(fake: Recorder, return_lse: bool, given_out: bool) -> None:
    """flash_attn_varlen_func's GPU branch (no plan: every call takes it): the native call
    gets each input's descriptor, out like q (the caller's when given), lse (nheads, total_q)
    float32 when asked, the options and the stream; the caller gets those arrays back."""
    q, k, v = rnd(9, 4, 16), rnd(11, 2, 16), rnd(11, 2, 16)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 11], dtype=torch.int32)
    given = torch.empty_like(q) if given_out else None
    r = flashscan.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 5, 6, causal=True, return_lse=return_lse, out=given
    )
    out, lse = r if return_lse else (r, None)
    assert given is None or out is given
    ((name, args),) = fake.calls
    assert name == "flash_attn_varlen_fwd"
    a = [norm(x) for x in args]
    for x, t in zip(a[:5], (q, k, v, cu_q, cu_k)):
        assert x == norm(_frameworks.handler_of(t, "t").describe(t, "t"))
    assert a[5] == (out.data_ptr(), (9, 4, 16), (64, 16, 1), "bfloat16", 2, 0)
    assert (out.shape, out.dtype) == (q.shape, q.dtype)
    if return_lse:
        assert a[6] == (lse.data_ptr(), (4, 9), (9, 1), "float32", 2, 0)
        assert (lse.shape, lse.dtype) == ((4, 9), torch.float32)
    else:
        assert a[6] is None
    assert a[7:] == [5, 6, 0.25, -1, 0, 0.0, 0]


def _bwd_inputs(varlen: bool) -> tuple[list[Any], list[Any]]:
    """(the backward impl's tensors dout, q, k, v, out, lse[, cu_seqlens_q, cu_seqlens_k],
    its other arguments): bf16, GQA 4 over 2, headdim 16; varlen packs 2 sequences."""
    if varlen:
        q, k, v = rnd(9, 4, 16), rnd(11, 2, 16), rnd(11, 2, 16)
        lse = torch.randn(4, 9)
        cu = [
            torch.tensor([0, 4, 9], dtype=torch.int32),
            torch.tensor([0, 6, 11], dtype=torch.int32),
        ]
        rest = [5, 6, 0.3, 2, 0, 1.5, True]
    else:
        q, k, v = rnd(2, 7, 4, 16), rnd(2, 9, 2, 16), rnd(2, 9, 2, 16)
        lse = torch.randn(2, 4, 7)
        cu = []
        rest = [0.3, 2, 0, 1.5, True]
    return [rnd(*q.shape), q, k, v, rnd(*q.shape), lse, *cu], rest


@pytest.mark.parametrize("varlen", [False, True])
def test_attention_backward_gpu_call(fake: Recorder, monkeypatch: Any, varlen: bool) -> None:
    """flashscan.torch's attention backward (the custom op's impl) on the GPU: one native call
    with every tensor's descriptor, dq/dk/dv like q/k/v, the varlen extras, the options and
    the stream; upstream gradients with a strided last dimension are made dense first."""
    fst = pytest.importorskip("flashscan.torch")
    monkeypatch.setattr(fst, "_native", fake)
    tensors, rest = _bwd_inputs(varlen)
    tensors[0] = torch.cat([tensors[0], tensors[0]], -1)[..., ::2]  # strided dout
    impl = fst._varlen_bwd_impl if varlen else fst._attn_bwd_impl
    dq, dk, dv = impl(*tensors, *rest)
    ((name, args),) = fake.calls
    assert name == ("flash_attn_varlen_bwd" if varlen else "flash_attn_bwd")
    a = [norm(x) for x in args]
    th = _frameworks.handler_of(tensors[1], "t")
    assert a[0][1:] == norm(th.describe(tensors[0].contiguous(), "t"))[1:]
    assert a[0][2][-1] == 1
    for x, t in zip(a[1:6], tensors[1:6]):
        assert x == norm(th.describe(t, "t"))
    for x, g, t in zip(a[6:9], (dq, dk, dv), tensors[1:4]):
        assert x == norm(th.describe(g, "t"))
        assert (g.shape, g.dtype) == (t.shape, t.dtype)
    cu = [norm(th.describe(t, "t")) for t in tensors[6:]]
    assert a[9:] == cu + rest + [0]


@pytest.mark.parametrize("varlen", [False, True])
def test_attention_backward_fallback(fake: Recorder, monkeypatch: Any, varlen: bool) -> None:
    """On a device the backend cannot serve: no native call, the reference's gradients, and
    the one fallback warning pointing two frames above the impl (here: the test)."""
    fst = pytest.importorskip("flashscan.torch")
    monkeypatch.setattr(fst, "_native", fake)
    monkeypatch.setattr(_backend, "_usable", frozenset())
    monkeypatch.setattr(_backend, "_policy", "warn")
    monkeypatch.setattr(_backend, "_warned", False)
    tensors, rest = _bwd_inputs(varlen)
    tensors = [t.float() if t.dtype == bf else t for t in tensors]
    impl = fst._varlen_bwd_impl if varlen else fst._attn_bwd_impl

    def call() -> Any:
        return impl(*tensors, *rest)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        grads = call()
    assert not fake.calls
    fw = [w for w in caught if issubclass(w.category, flashscan.FallbackWarning)]
    assert len(fw) == 1 and (fw[0].filename, fw[0].lineno) == (__file__, line)
    from flashscan import reference_bwd, reference_varlen

    ref = reference_varlen.flash_attn_varlen_bwd if varlen else reference_bwd.flash_attn_bwd
    want = ref(
        *(t.numpy() for t in tensors),
        softmax_scale=rest[-5],
        window_size=(rest[-4], rest[-3]),
        softcap=rest[-2],
    )
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


def scan_args(
    b: int, dim: int, L: int, n: int, bc: str, g: int, dtype: Any, bcdt: Any
) -> list[Any]:
    u = rnd(b, dim, L, dtype=dtype)
    if bc == "fixed":
        B, C = rnd(dim, n, dtype=f32), rnd(dim, n, dtype=f32)
    elif bc == "varying":
        B, C = rnd(b, n, L, dtype=bcdt), rnd(b, n, L, dtype=bcdt)
    else:
        B, C = rnd(b, g, n, L, dtype=bcdt), rnd(b, g, n, L, dtype=dtype)
    return [u, rnd(b, dim, L, dtype=dtype), -torch.rand(dim, n), B, C]


@pytest.mark.parametrize("bc,g", [("fixed", 1), ("varying", 1), ("grouped", 2)])
@pytest.mark.parametrize("dtype,bcdt", [(bf, bf), (bf, f32), (f32, f32), (f16, f16)])
@pytest.mark.parametrize("extras", [0, 1, 2])
def test_scan_plan(
    fake: Recorder, monkeypatch: Any, bc: str, g: int, dtype: Any, bcdt: Any, extras: int
) -> None:
    seen = general_calls(monkeypatch)
    b, dim, L, n = 2, 8, 13, 4
    a = scan_args(b, dim, L, n, bc, g, dtype, bcdt)
    kw: dict[str, Any] = {}
    if extras >= 1:
        kw.update(D=torch.nn.Parameter(torch.randn(dim)), z=rnd(b, dim, L, dtype=dtype))
    if extras >= 2:
        kw.update(delta_bias=torch.rand(dim), initial_state=torch.randn(b, dim, n))
    # D is a parameter that requires grad: calls under no_grad (inference) take the plan; with
    # grad mode on they would go to flashscan.torch (tested in test_torch_autograd)
    with torch.no_grad():
        for sp in (False, True):
            twice(
                fake,
                seen,
                lambda sp=sp: flashscan.selective_scan_fn(*a, **kw, delta_softplus=sp),
                1,
            )
            twice(
                fake,
                seen,
                lambda sp=sp: flashscan.selective_scan_fn(
                    *a, **kw, delta_softplus=sp, return_last_state=True
                ),
                2,
            )
    for bad in ({"delta_softplus": "x"}, {"return_last_state": 2}):
        msgs = []
        for _ in range(2):
            with pytest.raises(TypeError) as e:
                flashscan.selective_scan_fn(*a, **kw, **bad)
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]


@pytest.mark.parametrize("heads,g", [(None, 1), (4, 1), (4, 2)])
@pytest.mark.parametrize("dtype,bcdt", [(bf, bf), (bf, f32), (f32, f32)])
@pytest.mark.parametrize("extras", [False, True])
def test_state_update_plan(
    fake: Recorder, monkeypatch: Any, heads: Any, g: int, dtype: Any, bcdt: Any, extras: bool
) -> None:
    seen = general_calls(monkeypatch)
    b, dim, n = 3, 8, 4
    lead = (b,) if heads is None else (b, heads)
    hd = () if heads is None else (heads,)
    bcs = (b, n) if heads is None else (b, g, n)
    state = torch.randn(*lead, dim, n)
    x = rnd(*lead, dim, dtype=dtype)
    a = [
        state,
        x,
        rnd(*lead, dim, dtype=dtype),
        -torch.rand(*hd, dim, n),
        rnd(*bcs, dtype=bcdt),
        rnd(*bcs, dtype=dtype),
    ]
    kw: dict[str, Any] = {}
    if extras:
        kw = {
            "D": torch.randn(*hd, dim),
            "z": rnd(*lead, dim, dtype=dtype),
            "dt_bias": torch.nn.Parameter(torch.rand(*hd, dim)),
        }
    for sp in (False, True, 1):
        twice(
            fake, seen, lambda sp=sp: flashscan.selective_state_update(*a, **kw, dt_softplus=sp), 1
        )
    msgs = []
    for _ in range(2):
        with pytest.raises(TypeError) as e:
            flashscan.selective_state_update(*a, **kw, dt_softplus="x")
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_cpu_torch_records_no_plan() -> None:
    """Without the fake: CPU torch tensors go to the reference and never get a plan."""
    for d in (attention._PLANS, scan._SCAN_PLANS, scan._SSU_PLANS):
        d.clear()
    q = torch.randn(1, 4, 2, 8)
    for _ in range(3):
        flashscan.flash_attn_func(q, q, q)
        flashscan.selective_scan_fn(
            torch.randn(1, 4, 5),
            torch.rand(1, 4, 5),
            -torch.rand(4, 2),
            torch.randn(1, 2, 5),
            torch.randn(1, 2, 5),
        )
    assert not attention._PLANS and not scan._SCAN_PLANS


def test_sparse_and_odd_tensors_keep_their_errors() -> None:
    q = torch.randn(1, 4, 2, 8)
    sp = q.to_sparse()
    with pytest.raises(TypeError, match="q: torch tensors with layout"):
        flashscan.flash_attn_func(sp, q, q)
    meta = torch.empty(1, 4, 2, 8, device="meta")
    with pytest.raises(ValueError, match="k: torch tensors on device meta"):
        flashscan.flash_attn_func(q, meta, q)


def test_plans_are_bounded(fake: Recorder) -> None:
    for i in range(1, _checks._MEMO_SIZE + 20):
        q = rnd(1, i, 1, 8)
        flashscan.flash_attn_func(q, q, q)
    assert 0 < len(attention._PLANS) <= _checks._MEMO_SIZE


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("extras", [False, True])
def test_ssd_autograd_forward_takes_the_plan_from_the_second_call(
    fake: Recorder, monkeypatch: Any, extras: bool, final: bool
) -> None:
    """flashscan.torch's eager SSD forward (inputs requiring grad) records the core's plan on
    its first call and serves the next ones from it: the same `_native.ssd_fwd` arguments,
    no checks."""
    import flashscan.torch as fst

    seen = general_calls(monkeypatch)
    b, L, h, p, n = 2, 60, 4, 16, 8
    leaves = [
        rnd(b, L, h, p).requires_grad_(),
        torch.rand(b, L, h).requires_grad_(),
        (-torch.rand(h)).requires_grad_(),
        rnd(b, L, 1, n).requires_grad_(),
        rnd(b, L, 1, n).requires_grad_(),
    ]
    kw: dict[str, Any] = {"dt_softplus": True, "return_final_states": final}
    if extras:
        kw.update(D=torch.rand(h).requires_grad_(), z=rnd(b, L, h, p).requires_grad_())
        kw.update(dt_bias=torch.rand(h).requires_grad_())
    inputs = leaves + [t for t in kw.values() if isinstance(t, torch.Tensor)]
    known = {t.data_ptr(): f"in{i}" for i, t in enumerate(inputs)}

    def named(args: tuple) -> list[Any]:
        # input pointers by name; outputs and workspaces are fresh allocations: "new"
        return [
            (known.get(a[0], "new"), *norm(a)[1:]) if isinstance(a, tuple) and len(a) == 6 else a
            for a in args
        ]

    forget_plans()
    calls = []
    for i in range(3):
        seen.clear()
        r = fst.mamba_chunk_scan_combined(*leaves, 32, **kw)
        assert bool(seen) == (i == 0), (i, seen)  # the general path once, then the plan
        assert len(outs(r)) == 1 + final
        name, args = fake.calls[-1]
        assert name == "ssd_fwd"
        calls.append(named(args))
    assert calls[0] == calls[1] == calls[2]
    assert sum(a[0] == "new" for a in calls[0] if isinstance(a, tuple)) >= 3 + final
