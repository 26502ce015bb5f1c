"""flashscan.jax on a GPU: jitted calls (XLA custom calls of the native FFI handlers, on XLA's
stream) give what eager flashscan gives on the same arrays; jax.grad through the backward
kernels matches float64 gradients (the references', themselves checked against finite
differences on CPU) and a float64 finite difference; vmap folds into the kernels' batch; a
jitted training step of a tiny attention + scan model learns and matches the same step on CPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# jax must not take 75% of the GPU up front: torch GPU tests share this process
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import flashscan  # noqa: E402
from flashscan import jax as fj  # noqa: E402
from flashscan import reference  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def jax_gpu():
    if jax.default_backend() != "gpu":
        pytest.skip(f"jax has no GPU backend here (default backend {jax.default_backend()})")
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)  # float64 references beside the kernels
    yield
    jax.config.update("jax_enable_x64", old)


def rand(rng, *shape, dtype=np.float32):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float64)).astype(dtype)


def as64(x):
    return jax.device_put(jnp.asarray(x, jnp.float64), jax.devices("cpu")[0])


def assert_close_to(got, ref, rel):
    """max|got - ref| <= rel * max|ref| + 1e-6 (float32 kernels: 1e-4 elementwise, 1e-3 for
    gradients summed over batch and time, as tests/test_backward_gpu.py)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(got).all()
    err = np.abs(got - ref).max()
    scale = np.abs(ref).max()
    assert err <= rel * scale + 1e-6, f"max error {err:.3g} > {rel} * {scale:.3g} + 1e-6"


# ---------------------------------------------------------------------------------------------
# jitted == eager
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize(
    "shape,kw",
    [
        ((2, 65, 63, 4, 2, 64), {"causal": True}),
        ((1, 1000, 1000, 8, 8, 128), {}),
        ((3, 7, 300, 4, 1, 96), {"window_size": (64, 0), "softcap": 20.0}),
    ],
)
def test_attention_jit_equals_eager(dtype, shape, kw):
    b, sq, sk, h, hk, d = shape
    rng = np.random.default_rng(0)
    q, k, v = (
        rand(rng, b, sq, h, d, dtype=dtype),
        rand(rng, b, sk, hk, d, dtype=dtype),
        rand(rng, b, sk, hk, d, dtype=dtype),
    )
    got, lse = jax.jit(lambda q, k, v: fj.flash_attn_func(q, k, v, return_lse=True, **kw))(q, k, v)
    want, want_lse = flashscan.flash_attn_func(q, k, v, return_lse=True, **kw)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(want_lse))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_scan_and_state_update_jit_equal_eager(dtype):
    rng = np.random.default_rng(1)
    batch, dim, seqlen, n = 2, 64, 300, 16
    u, delta, z = (rand(rng, batch, dim, seqlen, dtype=dtype) for _ in range(3))
    A = -jnp.asarray(rng.random((dim, n)) + 0.5, jnp.float32)
    B, C = rand(rng, batch, 2, n, seqlen, dtype=dtype), rand(rng, batch, 2, n, seqlen, dtype=dtype)
    D, bias = rand(rng, dim), rand(rng, dim)
    init = rand(rng, batch, dim, n)
    kw = {"D": D, "z": z, "delta_bias": bias, "delta_softplus": True, "initial_state": init}
    out, last = jax.jit(lambda *a: fj.selective_scan_fn(*a, **kw, return_last_state=True))(
        u, delta, A, B, C
    )
    want, want_last = flashscan.selective_scan_fn(u, delta, A, B, C, **kw, return_last_state=True)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(np.asarray(last), np.asarray(want_last), rtol=1e-6, atol=1e-6)

    # the state update: jitted (state donated: updated in XLA's buffer) vs the host reference
    state = rand(rng, batch, dim, n)
    x, dt = rand(rng, batch, dim, dtype=dtype), rand(rng, batch, dim, dtype=dtype)
    Bs, Cs = rand(rng, batch, n, dtype=dtype), rand(rng, batch, n, dtype=dtype)
    st_np = np.array(state)
    step = jax.jit(
        lambda s, x: fj.selective_state_update(
            s, x, dt, A, Bs, Cs, D=D, dt_bias=bias, dt_softplus=True
        ),
        donate_argnums=0,
    )
    o, new = step(state, x)
    want_o = reference.selective_state_update(
        st_np,
        *(np.asarray(a, np.float32) for a in (x, dt, A, Bs, Cs, D)),
        dt_bias=np.asarray(bias),
        dt_softplus=True,
    )
    assert_close_to(o, want_o, 1e-2 if dtype == jnp.bfloat16 else 1e-5)
    assert_close_to(new, st_np, 1e-5)


def test_vmap_folds_into_the_kernel_batch():
    rng = np.random.default_rng(2)
    q, k, v = (rand(rng, 3, 2, 129, 4, 64, dtype=jnp.bfloat16) for _ in range(3))
    got = jax.jit(jax.vmap(lambda q, k, v: fj.flash_attn_func(q, k, v, causal=True)))(q, k, v)
    hlo = (
        jax.jit(jax.vmap(lambda q, k, v: fj.flash_attn_func(q, k, v, causal=True)))
        .lower(q, k, v)
        .as_text()
    )
    assert hlo.count("flashscan_flash_attn_fwd") == 1  # one custom call over batch 3 * 2
    for i in range(3):
        want = fj.flash_attn_func(q[i], k[i], v[i], causal=True)
        np.testing.assert_array_equal(np.asarray(got[i], np.float32), np.asarray(want, np.float32))


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


def test_attention_grad_matches_float64_and_finite_differences():
    rng = np.random.default_rng(3)
    b, sq, sk, h, hk, d = 2, 37, 53, 4, 2, 64
    q, k, v = rand(rng, b, sq, h, d), rand(rng, b, sk, hk, d), rand(rng, b, sk, hk, d)
    w = rand(rng, b, sq, h, d)

    def loss(q, k, v, w):
        return (fj.flash_attn_func(q, k, v, causal=True, softcap=5.0) * w).sum()

    g32 = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, w)  # the backward kernel
    args64 = [as64(x) for x in (q, k, v, w)]
    g64 = jax.grad(loss, argnums=(0, 1, 2))(*args64)  # the float64 reference on the host
    for a, r in zip(g32, g64):
        assert_close_to(a, r, 1e-4)
    # a float64 central difference along a random direction
    t = [as64(rand(rng, *x.shape)) for x in (q, k, v)]
    eps = 1e-5
    plus = loss(*(x + eps * dx for x, dx in zip(args64[:3], t)), args64[3])
    minus = loss(*(x - eps * dx for x, dx in zip(args64[:3], t)), args64[3])
    fd = float((plus - minus) / (2 * eps))
    ad = sum(float((np.asarray(a, np.float64) * np.asarray(dx)).sum()) for a, dx in zip(g32, t))
    assert abs(ad - fd) <= 1e-4 * max(abs(fd), 1.0), (ad, fd)


def test_scan_grad_matches_float64():
    rng = np.random.default_rng(4)
    batch, dim, seqlen, n = 2, 32, 600, 8  # > 256 steps: the forward's saved states are used
    u, delta, z = (
        rand(rng, batch, dim, seqlen),
        rand(rng, batch, dim, seqlen) * 0.5,
        rand(rng, batch, dim, seqlen),
    )
    A = -jnp.asarray(rng.random((dim, n)) + 0.5, jnp.float32)
    B, C = rand(rng, batch, n, seqlen), rand(rng, batch, n, seqlen)
    D, bias, init = rand(rng, dim), rand(rng, dim) * 0.1, rand(rng, batch, dim, n)
    w = rand(rng, batch, dim, seqlen)

    def loss(u, delta, A, B, C, D, z, bias, init, w):
        out, last = fj.selective_scan_fn(u, delta, A, B, C, D, z, bias, True, True, init)
        return (out * w).sum() + last.sum()

    argnums = tuple(range(9))
    args = (u, delta, A, B, C, D, z, bias, init, w)
    g32 = jax.jit(jax.grad(loss, argnums=argnums))(*args)
    g64 = jax.grad(loss, argnums=argnums)(*(as64(x) for x in args))
    summed = {"A", "B", "C", "D", "bias"}  # sums over batch, time or channels
    for name, a, r in zip("u delta A B C D z bias init".split(), g32, g64):
        try:
            assert_close_to(a, r, 1e-3 if name in summed else 1e-4)
        except AssertionError as e:
            raise AssertionError(f"d{name}: {e}") from None


# ---------------------------------------------------------------------------------------------
# A jitted training step of a tiny attention + scan model
# ---------------------------------------------------------------------------------------------


def tiny_model_params(rng, d_model=64, heads=2, dstate=8):
    hd = d_model // heads
    p = {
        "wq": rand(rng, d_model, d_model) / 8,
        "wk": rand(rng, d_model, d_model) / 8,
        "wv": rand(rng, d_model, d_model) / 8,
        "wu": rand(rng, d_model, d_model) / 8,
        "wdt": rand(rng, d_model, d_model) / 8,
        "wb": rand(rng, d_model, dstate) / 8,
        "wc": rand(rng, d_model, dstate) / 8,
        "A": -jnp.asarray(rng.random((d_model, dstate)) + 0.5, jnp.float32),
        "D": rand(rng, d_model),
    }
    return p, heads, hd


def tiny_model_loss(p, x, y, heads, hd):
    b, L, dm = x.shape
    q = (x @ p["wq"]).reshape(b, L, heads, hd)
    k = (x @ p["wk"]).reshape(b, L, heads, hd)
    v = (x @ p["wv"]).reshape(b, L, heads, hd)
    h = x + fj.flash_attn_func(q, k, v, causal=True).reshape(b, L, dm)
    u = (h @ p["wu"]).transpose(0, 2, 1)
    dt = (h @ p["wdt"]).transpose(0, 2, 1)
    B = (h @ p["wb"]).transpose(0, 2, 1)
    C = (h @ p["wc"]).transpose(0, 2, 1)
    s = fj.selective_scan_fn(u, dt, p["A"], B, C, D=p["D"], delta_softplus=True)
    out = h + s.transpose(0, 2, 1)
    return ((out - y) ** 2).mean()


def test_jitted_training_step_learns_and_matches_cpu():
    rng = np.random.default_rng(5)
    params, heads, hd = tiny_model_params(rng)
    x, y = rand(rng, 4, 96, 64), rand(rng, 4, 96, 64)

    def step(p, x, y):
        loss, g = jax.value_and_grad(tiny_model_loss)(p, x, y, heads, hd)
        return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g), loss, g

    gpu_step = jax.jit(step)
    _, _, g_gpu = gpu_step(params, x, y)
    cpu = jax.devices("cpu")[0]
    on_cpu = jax.device_put((params, x, y), cpu)
    _, _, g_cpu = jax.jit(step)(*on_cpu)  # the same step lowered for CPU: the references
    for name in params:
        # one SGD step of float32 kernels vs XLA:CPU float32: summation orders differ
        assert_close_to(g_gpu[name], g_cpu[name], 3e-3)
    losses = []
    p = params
    for _ in range(30):
        p, loss, _ = gpu_step(p, x, y)
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses
