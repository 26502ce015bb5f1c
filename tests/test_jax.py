"""flashscan.jax on CPU (runs in CI): every op under jit / grad / vmap against the NumPy
references, gradients against float64 finite differences, the core API's errors at trace time,
and the native XLA FFI handlers driven by a real XLA (registered for XLA:CPU, where they answer
the metadata stage, read buffers and attributes, and report errors through the API table)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

# jax must not take 75% of a GPU up front where GPU tests share this process
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from jax.test_util import check_grads  # noqa: E402

import flashscan  # noqa: E402
from flashscan import _backend, reference  # noqa: E402
from flashscan import jax as fj  # noqa: E402


@pytest.fixture(autouse=True)
def x64():
    """float64 arrays (the references' precision) for the duration of each test."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def rand(rng: np.random.Generator, *shape: int, dtype=np.float64) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape).astype(dtype))


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

ATTN_CASES = [
    # (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, kwargs)
    (2, 5, 7, 4, 2, 8, {"causal": True}),
    (1, 1, 9, 2, 2, 16, {}),
    (2, 7, 7, 3, 1, 8, {"window_size": (2, 1), "softcap": 3.0}),
    (1, 6, 4, 2, 1, 8, {"causal": True, "softmax_scale": 0.3}),
]


@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention_jit_matches_reference(case):
    b, sq, sk, h, hk, d, kw = case
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, b, sq, h, d), rand(rng, b, sk, hk, d), rand(rng, b, sk, hk, d)
    out, lse = jax.jit(lambda q, k, v: fj.flash_attn_func(q, k, v, return_lse=True, **kw))(q, k, v)
    ref, ref_lse = reference.flash_attn_func(
        *(np.asarray(x) for x in (q, k, v)), return_lse=True, accum_dtype=np.float64, **kw
    )
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-6)
    assert out.dtype == jnp.float64 and lse.dtype == jnp.float32


def test_attention_float32_and_bfloat16():
    """The kernels' dtypes: the references on CPU, the kernels where jax has a GPU."""
    rng = np.random.default_rng(2)
    q, k, v = (rand(rng, 1, 9, 2, 16, dtype=np.float32) for _ in range(3))
    ref = reference.flash_attn_func(*(np.asarray(x, np.float64) for x in (q, k, v)))
    out = jax.jit(fj.flash_attn_func)(q, k, v)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-4)
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    outb = jax.jit(fj.flash_attn_func)(qb, kb, vb)
    assert outb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(outb, np.float32), ref, atol=3e-2)


@pytest.mark.parametrize("case", ATTN_CASES[:3])
def test_attention_grad_matches_finite_differences(case):
    b, sq, sk, h, hk, d, kw = case
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, b, sq, h, d), rand(rng, b, sk, hk, d), rand(rng, b, sk, hk, d)
    check_grads(
        lambda q, k, v: fj.flash_attn_func(q, k, v, **kw),
        (q, k, v),
        order=1,
        modes=["rev"],
        atol=1e-6,
        rtol=1e-6,
    )


def test_attention_vmap_folds_into_batch_and_matches_a_loop():
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, 3, 2, 5, 2, 8), rand(rng, 3, 2, 6, 1, 8), rand(rng, 2, 6, 1, 8)
    f = jax.jit(jax.vmap(lambda q, k, v: fj.flash_attn_func(q, k, v, causal=True), (0, 0, None)))
    got = f(q, k, v)
    for i in range(3):
        want = fj.flash_attn_func(q[i], k[i], v, causal=True)
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=1e-13, atol=1e-13)
    # vmap of grad: per-example gradients, as a loop gives them
    loss = lambda q, k: (fj.flash_attn_func(q, k, v) ** 2).sum()  # noqa: E731
    g = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(q, k)
    for i in range(3):
        gi = jax.grad(loss, argnums=(0, 1))(q[i], k[i])
        for a, b_ in zip(g, gi):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b_), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------


def scan_inputs(rng, batch=2, dim=4, seqlen=7, dstate=3, *, b_form="varying", full=True):
    u, delta = rand(rng, batch, dim, seqlen), rand(rng, batch, dim, seqlen) * 0.5
    A = -jnp.asarray(rng.random((dim, dstate)) + 0.2)
    shapes = {
        "fixed": (dim, dstate),
        "varying": (batch, dstate, seqlen),
        "grouped": (batch, 2, dstate, seqlen),
    }
    B, C = rand(rng, *shapes[b_form]), rand(rng, *shapes[b_form])
    opt = {}
    if full:
        opt = {
            "D": rand(rng, dim),
            "z": rand(rng, batch, dim, seqlen),
            "delta_bias": rand(rng, dim) * 0.1,
            "initial_state": rand(rng, batch, dim, dstate),
        }
    return (u, delta, A, B, C), opt


@pytest.mark.parametrize("b_form", ["fixed", "varying", "grouped"])
@pytest.mark.parametrize("full", [False, True])
def test_scan_jit_matches_reference(b_form, full):
    rng = np.random.default_rng(5)
    args, opt = scan_inputs(rng, b_form=b_form, full=full)
    f = jax.jit(
        lambda *a, **o: fj.selective_scan_fn(*a, **o, delta_softplus=True, return_last_state=True)
    )
    out, last = f(*args, **opt)
    ref, ref_last = reference.selective_scan_fn(
        *(np.asarray(x) for x in args),
        **{k: np.asarray(x) for k, x in opt.items()},
        delta_softplus=True,
        return_last_state=True,
    )
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(last), ref_last, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("b_form", ["fixed", "grouped"])
def test_scan_grad_matches_finite_differences(b_form):
    rng = np.random.default_rng(6)
    (u, delta, A, B, C), opt = scan_inputs(rng, seqlen=5, b_form=b_form)

    def f(u, delta, A, B, C, D, z, bias, init):
        out, last = fj.selective_scan_fn(
            u, delta, A, B, C, D, z, bias, True, return_last_state=True, initial_state=init
        )
        return out, last

    args = (u, delta, A, B, C, opt["D"], opt["z"], opt["delta_bias"], opt["initial_state"])
    check_grads(f, args, order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_scan_vmap_folds_or_maps_and_matches_a_loop():
    rng = np.random.default_rng(7)
    (u, delta, A, B, C), _ = scan_inputs(rng, full=False)
    us, Bs = jnp.stack([u, u * 0.5, -u]), jnp.stack([B, B * 2, B])
    As = jnp.stack([A, A * 2, A * 0.5])
    f = lambda u, B, A: fj.selective_scan_fn(u, delta, A, B, C, delta_softplus=True)  # noqa: E731
    folded = jax.jit(jax.vmap(f, (0, 0, None)))(us, Bs, A)  # one call, vmap axis in the batch
    mapped = jax.jit(jax.vmap(f, (0, 0, 0)))(us, Bs, As)  # per-example A: one call per example
    for i in range(3):
        np.testing.assert_allclose(
            np.asarray(folded[i]), np.asarray(f(us[i], Bs[i], A)), rtol=1e-12, atol=1e-12
        )
        np.testing.assert_allclose(
            np.asarray(mapped[i]), np.asarray(f(us[i], Bs[i], As[i])), rtol=1e-12, atol=1e-12
        )
    # per-example gradient of a shared weight: each example's own dA, not their sum
    loss = lambda u, A: (f(u, B, A) ** 2).sum()  # noqa: E731
    g = jax.jit(jax.vmap(jax.grad(loss, argnums=1), (0, None)))(us, A)
    for i in range(3):
        np.testing.assert_allclose(
            np.asarray(g[i]), np.asarray(jax.grad(loss, argnums=1)(us[i], A)), rtol=1e-11
        )


def test_grad_of_vmap_matches_a_loop():
    """grad(vmap(f)): the batched forward and backward of the custom_vjp (weight gradients
    summed over the examples, as a loop sums them)."""
    rng = np.random.default_rng(10)
    q = rand(rng, 3, 2, 5, 2, 8)
    attn = lambda q: fj.flash_attn_func(q, q, q, causal=True)  # noqa: E731
    g = jax.jit(jax.grad(lambda q: (jax.vmap(attn)(q) ** 2).sum()))(q)
    for i in range(3):
        gi = jax.grad(lambda q: (attn(q) ** 2).sum())(q[i])
        np.testing.assert_allclose(np.asarray(g[i]), np.asarray(gi), rtol=1e-12, atol=1e-12)
    (u, _, A, B, _), _ = scan_inputs(rng, full=False)
    us = jnp.stack([u, -u, 2 * u])
    scan = lambda u, A: fj.selective_scan_fn(u, u, A, B, B, delta_softplus=True)  # noqa: E731
    loss = lambda us, A: (jax.vmap(scan, (0, None))(us, A) ** 2).sum()  # noqa: E731
    gu, ga = jax.jit(jax.grad(loss, argnums=(0, 1)))(us, A)
    loop = [
        jax.grad(lambda u, A: (scan(u, A) ** 2).sum(), argnums=(0, 1))(us[i], A) for i in range(3)
    ]
    np.testing.assert_allclose(np.asarray(gu), np.stack([x[0] for x in loop]), rtol=1e-11)
    np.testing.assert_allclose(np.asarray(ga), sum(np.asarray(x[1]) for x in loop), rtol=1e-11)


# ---------------------------------------------------------------------------------------------
# State update
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [False, True])
def test_state_update_jit_and_vmap_match_reference(heads):
    rng = np.random.default_rng(8)
    batch, h, dim, n = 3, 2, 4, 5
    lead = (batch, h) if heads else (batch,)
    wl = (h,) if heads else ()
    state = rand(rng, *lead, dim, n)
    x, dt, z = rand(rng, *lead, dim), rand(rng, *lead, dim), rand(rng, *lead, dim)
    A = -jnp.asarray(rng.random((*wl, dim, n)))
    B = rand(rng, batch, 1, n) if heads else rand(rng, batch, n)
    C = rand(rng, batch, 1, n) if heads else rand(rng, batch, n)
    D, bias = rand(rng, *wl, dim), rand(rng, *wl, dim)
    f = lambda s, x: fj.selective_state_update(  # noqa: E731
        s, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True
    )
    out, new = jax.jit(f)(state, x)
    st = np.array(state)
    ref = reference.selective_state_update(
        st, *(np.asarray(a) for a in (x, dt, A, B, C, D, z, bias)), dt_softplus=True
    )
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(new), st, rtol=1e-12, atol=1e-12)
    assert not np.allclose(np.asarray(state), st)  # the input is untouched (functional)
    # vmap over a stack of states (and x): folded into the batch
    states, xs = jnp.stack([state, state * 2]), jnp.stack([x, -x])
    outs, news = jax.jit(jax.vmap(f))(states, xs)
    for i in range(2):
        o_i, n_i = f(states[i], xs[i])
        np.testing.assert_allclose(np.asarray(outs[i]), np.asarray(o_i), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(news[i]), np.asarray(n_i), rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# Errors: the core API's, at trace time
# ---------------------------------------------------------------------------------------------


def test_bad_input_gets_the_core_errors():
    q = jnp.zeros((1, 4, 2, 16), jnp.float32)
    k = jnp.zeros((1, 4, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match="k: headdim 8 does not match q's headdim 16"):
        jax.jit(fj.flash_attn_func)(q, k, k)
    with pytest.raises(TypeError, match="k: dtype float16 does not match q's dtype float32"):
        fj.flash_attn_func(q, q.astype(jnp.float16), q)
    with pytest.raises(flashscan.UnsupportedError, match="headdim 264"):
        big = jnp.zeros((1, 2, 1, 264), jnp.float32)
        fj.flash_attn_func(big, big, big)
    with pytest.raises(ValueError, match="window_size: left must be -1"):
        fj.flash_attn_func(q, q, q, window_size=(-3, 0))
    u = jnp.zeros((1, 4, 5), jnp.float32)
    with pytest.raises(ValueError, match=r"A: expected shape \(dim=4, dstate\)"):
        fj.selective_scan_fn(u, u, jnp.zeros((3, 2), jnp.float32), u, u)
    with pytest.raises(TypeError, match="A: expected dtype float32"):
        fj.selective_scan_fn(u, u, jnp.zeros((4, 2), jnp.float16), jnp.zeros((4, 2)), u)
    with pytest.raises(TypeError, match="state: expected dtype float32"):
        s16 = jnp.zeros((1, 4, 2), jnp.float16)
        fj.selective_state_update(s16, u[:, :, 0], u[:, :, 0], s16[0], s16[:, 0], s16[:, 0])


def test_state_update_says_it_has_no_gradient():
    s, x = jnp.zeros((1, 4, 2), jnp.float32), jnp.zeros((1, 4), jnp.float32)
    A, B = jnp.zeros((4, 2), jnp.float32), jnp.zeros((1, 2), jnp.float32)
    with pytest.raises(TypeError, match="selective_state_update has no gradient"):
        jax.grad(lambda x: fj.selective_state_update(s, x, x, A, B, B)[0].sum())(x)
    # with its inputs behind stop_gradient, the rest of the function differentiates
    sg = jax.lax.stop_gradient
    g = jax.grad(lambda x: fj.selective_state_update(s, sg(x), sg(x), A, B, B)[0].sum() + x.sum())(
        x
    )
    np.testing.assert_array_equal(np.asarray(g), np.ones((1, 4)))


def test_importing_flashscan_does_not_import_jax():
    code = (
        "import sys, numpy as np, flashscan\n"
        "x = np.ones((1, 2, 1, 8), np.float32)\n"
        "flashscan.flash_attn_func(x, x, x)\n"
        "assert 'flashscan.jax' not in sys.modules and 'jax' not in sys.modules, "
        "sorted(m for m in sys.modules if 'jax' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# The native handlers, driven by XLA:CPU (no stream there: the checks run, then a clear error)
# ---------------------------------------------------------------------------------------------

needs_native = pytest.mark.skipif(_backend.native is None, reason="native module not built")


_CPU_TARGETS: dict = {}


@pytest.fixture
def cpu_targets():
    """The handlers registered for XLA:CPU under test names (registration calls each one at
    the metadata stage: an unsupported answer would fail here), and CPU as the default device
    (on a GPU machine too: these calls must run on XLA:CPU)."""
    if not _CPU_TARGETS:
        targets = _backend.native.xla_ffi_targets()  # type: ignore[union-attr]
        assert set(targets) == {
            "flash_attn_fwd",
            "flash_attn_bwd",
            "selective_scan_fwd",
            "selective_scan_bwd",
            "selective_state_update",
        }
        for name, capsule in targets.items():
            jax.ffi.register_ffi_target("cputest_" + name, capsule, platform="cpu", api_version=1)
        _CPU_TARGETS.update(targets)
    with jax.default_device(jax.devices("cpu")[0]):
        yield _CPU_TARGETS


def attn_call(q, k, v, **attrs):
    b, sq, h, _ = q.shape
    results = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((b, h, sq), jnp.float32),
    )
    attrs = {
        "softmax_scale": np.float32(1.0),
        "window_left": np.int64(-1),
        "window_right": np.int64(-1),
        "softcap": np.float32(0.0),
        **attrs,
    }
    return jax.ffi.ffi_call("cputest_flash_attn_fwd", results)(q, k, v, **attrs)


@needs_native
def test_native_handler_answers_metadata_and_reports_no_stream(cpu_targets):
    assert _backend.native.xla_ffi_api_version() == (0, 1)  # type: ignore[union-attr]
    q = jnp.zeros((1, 4, 2, 16), jnp.float16)
    with pytest.raises(Exception, match="flash_attn_fwd: .*no CUDA stream"):
        jax.block_until_ready(attn_call(q, q, q))


@needs_native
def test_native_handler_reports_the_ops_checks(cpu_targets):
    q = jnp.zeros((1, 4, 2, 16), jnp.float16)
    k = jnp.zeros((1, 4, 2, 8), jnp.float16)
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT: flashscan flash_attn_fwd: k has shape"):
        jax.block_until_ready(attn_call(q, k, k))
    with pytest.raises(Exception, match="attribute softcap is missing"):
        b, sq, h, _ = q.shape
        res = (
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, h, sq), jnp.float32),
        )
        call = jax.ffi.ffi_call("cputest_flash_attn_fwd", res)
        jax.block_until_ready(
            call(
                q,
                q,
                q,
                softmax_scale=np.float32(1),
                window_left=np.int64(-1),
                window_right=np.int64(-1),
            )
        )
    # float64 is rejected by the op with its own message
    q64 = jnp.zeros((1, 4, 2, 16), jnp.float64)
    with pytest.raises(Exception, match="float64"):
        jax.block_until_ready(attn_call(q64, q64, q64))


@needs_native
def test_native_scan_handler_reads_optional_operands(cpu_targets):
    u = jnp.zeros((1, 4, 5), jnp.float32)
    A = jnp.zeros((4, 3), jnp.float32)
    B = jnp.zeros((1, 3, 5), jnp.float32)
    D_bad = jnp.zeros((5,), jnp.float32)  # D must be (dim,) = (4,)
    res = (jax.ShapeDtypeStruct(u.shape, u.dtype), jax.ShapeDtypeStruct((1, 4, 3), jnp.float32))
    call = jax.ffi.ffi_call("cputest_selective_scan_fwd", res)
    with pytest.raises(Exception, match=r"D must have shape \[4\], got \[5\]"):
        jax.block_until_ready(
            call(u, u, A, B, B, D_bad, delta_softplus=np.int64(0), optional=np.int64(1))
        )
    # an operand count that disagrees with `optional` is named, not misread
    with pytest.raises(Exception, match="called with 6 operands and 2 results, expected 5"):
        jax.block_until_ready(
            call(u, u, A, B, B, D_bad, delta_softplus=np.int64(0), optional=np.int64(0))
        )


# ---------------------------------------------------------------------------------------------
# The GPU lowering, checked without a GPU: lowered for CUDA, each op is one custom call of its
# target with the calling convention of src/xla_ffi/handlers.rs; lowered for CPU, the CUDA
# branch is pruned and the references run
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def pretend_targets(monkeypatch):
    """As on a GPU machine: the CUDA targets count as registered (nothing is compiled here)."""
    monkeypatch.setattr(fj, "_registered", True)


def cuda_calls(fn, *args) -> list[str]:
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return [line.strip() for line in text.splitlines() if "stablehlo.custom_call" in line]


def test_cuda_lowering_emits_the_ffi_calls(pretend_targets):
    q = jnp.zeros((2, 5, 2, 8), jnp.bfloat16)
    loss = lambda q: fj.flash_attn_func(q, q, q, causal=True).astype(jnp.float32).sum()  # noqa: E731
    calls = cuda_calls(jax.grad(loss), q)
    assert [c.split("@")[1].split("(")[0] for c in calls] == [
        "flashscan_flash_attn_fwd",
        "flashscan_flash_attn_bwd",
    ]
    assert "window_left = -1 : i64, window_right = 0 : i64" in calls[0]
    assert "deterministic = 0 : i64" in calls[1]
    # vmap folds into the kernel's batch: one call on (3 * 2, ...)
    (call,) = cuda_calls(jax.vmap(lambda q: fj.flash_attn_func(q, q, q)), jnp.stack([q] * 3))
    assert "tensor<6x5x2x8xbf16>" in call

    u = jnp.zeros((2, 4, 300), jnp.float32)
    A, B = -jnp.ones((4, 3), jnp.float32), jnp.zeros((2, 3, 300), jnp.float32)
    scan_loss = lambda u, D: fj.selective_scan_fn(  # noqa: E731
        u, u, A, B, B, D=D, return_last_state=True
    )[1].sum()
    fwd, bwd = cuda_calls(jax.grad(scan_loss), u, A[:, 0])
    assert "@flashscan_selective_scan_fwd" in fwd and "optional = 1 : i64" in fwd
    assert "tensor<2x4x1x3xf32>" in fwd  # the saved chunk states (300 steps: one boundary)
    # D, the saved states and the last state's gradient: bits 1 + 16 + 32
    assert "@flashscan_selective_scan_bwd" in bwd and "optional = 49 : i64" in bwd

    st, x = jnp.zeros((2, 4, 3), jnp.float32), jnp.zeros((2, 4), jnp.float32)
    (upd,) = cuda_calls(
        lambda st, x: fj.selective_state_update(st, x, x, A, B[..., 0], B[..., 0]), st, x
    )
    assert "@flashscan_selective_state_update" in upd
    assert "output_tuple_indices = [1], operand_index = 0" in upd  # the state is updated in place


def test_cpu_lowering_prunes_the_cuda_branch(pretend_targets):
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(9)
    q = jax.device_put(rand(rng, 2, 5, 2, 8).astype(jnp.float32), cpu)
    f = lambda q: fj.flash_attn_func(q, q, q, causal=True)  # noqa: E731
    assert "flashscan_" not in jax.jit(f).lower(q).as_text()
    ref = reference.flash_attn_func(*(np.asarray(q),) * 3, causal=True)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(q)), ref, atol=1e-5)
    g = jax.jit(jax.grad(lambda q: f(q).sum()))(q)
    v = jax.jit(jax.vmap(f))(jnp.stack([q, q]))
    assert g.shape == q.shape and np.isfinite(np.asarray(g)).all()
    np.testing.assert_allclose(np.asarray(v[1]), ref, atol=1e-5)
