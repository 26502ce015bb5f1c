"""flashscan for JAX: the kernels inside `jax.jit`, `jax.grad` and `jax.vmap`.

    from flashscan.jax import flash_attn_func, selective_scan_fn, selective_state_update

Same names, arguments and semantics as the core API (flash-attn's and mamba_ssm's), on jax
arrays, traceable:

- On a GPU, each call lowers to an XLA custom call (typed FFI) of a handler in the native module
  (`src/xla_ffi/`): our kernels launch on XLA's own CUDA stream, with no host synchronisation,
  so a jitted step stays asynchronous. Kernels are compiled at their first call and cached (in
  memory and on disk, as for every flashscan call).
- On CPU (and for float64 anywhere), the same functions run the NumPy references through
  `jax.pure_callback`, so the same code runs everywhere. The choice is made per platform at
  lowering time (`jax.lax.platform_dependent`).
- Gradients: `jax.custom_vjp` with the backward kernels (attention and selective scan; lse and
  the state update carry no gradient).
- vmap: a batching rule folds the vmapped axis into the kernels' batch axis where the op allows
  it (every batched operand has a batch axis; per-example weights or weight gradients instead
  run one call per example with `jax.lax.map`).

Bad input gets the core API's clear errors (TypeError / ValueError / UnsupportedError naming the
argument) at trace time. This module is imported only when the user imports it.

Adding an op (Mamba-2 SSD, varlen attention, ...): its handler in `src/xla_ffi/handlers.rs`
(listed in `TARGETS`), then here a `_<op>_call` (ffi_call on CUDA, the reference through
`_host_call` elsewhere, chosen by `_on_platform`), wrapped by `_batched` for vmap and by a
`jax.custom_vjp` when it has a backward, and the public function running `_checks` first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _backend, _checks, reference, reference_bwd
from ._frameworks import CUDA

__all__ = ["flash_attn_func", "selective_scan_fn", "selective_state_update", "TARGET_PREFIX"]

TARGET_PREFIX = "flashscan_"
_FLOATS = (np.dtype(np.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32))
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

# Bits of the handlers' `optional` attribute (src/xla_ffi/handlers.rs: scan_bits, update_bits).
_SCAN_D, _SCAN_Z, _SCAN_BIAS, _SCAN_INIT, _SCAN_SAVED, _SCAN_DLAST = 1, 2, 4, 8, 16, 32
_UPD_D, _UPD_Z, _UPD_BIAS = 1, 2, 4

# The forward keeps the state every _SAVE_CHUNK steps for the backward (src/ops/scan.rs).
_SAVE_CHUNK = 256

_registered: bool | None = None


# ---------------------------------------------------------------------------------------------
# Registration and platform choice
# ---------------------------------------------------------------------------------------------


def _gpu_targets() -> bool:
    """Registers the native handlers with XLA for CUDA once; whether they can serve calls."""
    global _registered
    if _registered is None:
        native = _backend.native
        ok = native is not None and bool(_backend.usable_devices())
        if ok:
            for name, capsule in native.xla_ffi_targets().items():  # type: ignore[union-attr]
                jax.ffi.register_ffi_target(
                    TARGET_PREFIX + name, capsule, platform="CUDA", api_version=1
                )
        _registered = ok
    return _registered


def _on_platform(
    args: Sequence[Any], gpu: Callable[..., Any] | None, host: Callable[..., Any]
) -> Any:
    """`gpu(*args)` where the computation is lowered for CUDA, `host(*args)` elsewhere."""
    if gpu is None or not _gpu_targets():
        return tuple(host(*args))
    # both branches must give the same pytree: tuples (ffi_call returns lists)
    return jax.lax.platform_dependent(
        *args, cuda=lambda *a: tuple(gpu(*a)), default=lambda *a: tuple(host(*a))
    )


def _host_call(fn: Callable[..., Any], results: Any, *args: Any) -> Any:
    """A NumPy function under `jax.pure_callback` (bfloat16 goes to the host as float32)."""

    def run(*arrays: Any) -> Any:
        host = [None if a is None else _np(a) for a in arrays]
        outs = fn(*host)
        flat, tree = jax.tree_util.tree_flatten(outs)
        want = jax.tree_util.tree_leaves(results)
        return jax.tree_util.tree_unflatten(
            tree, [np.asarray(o, dtype=w.dtype) for o, w in zip(flat, want)]
        )

    return jax.pure_callback(run, results, *args, vmap_method="sequential")


def _np(a: Any) -> np.ndarray:
    x = np.asarray(a)
    return x.astype(np.float32) if x.dtype == np.dtype(jnp.bfloat16) else x


def _sds(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), np.dtype(dtype))


# ---------------------------------------------------------------------------------------------
# Batching: fold the vmapped axis into the kernels' batch axis
# ---------------------------------------------------------------------------------------------


def _batched(
    fn: Callable[..., Any], batch_first: Sequence[bool], fold_ok: bool
) -> Callable[..., Any]:
    """`fn` over arrays (None allowed) with a vmap rule. batch_first[i]: operand i has the op's
    batch as its leading axis. When every vmapped operand is such and `fold_ok` (every output is
    batch-first too, no per-example weight gradient), the vmapped axis is folded into the batch:
    one kernel call. Otherwise one call per example (`jax.lax.map`)."""

    @jax.custom_batching.custom_vmap
    def call(*args: Any) -> Any:
        return fn(*args)

    @call.def_vmap
    def rule(axis_size: int, in_batched: Sequence[Any], *args: Any) -> Any:
        flags = [
            bool(jax.tree_util.tree_leaves(b) and all(jax.tree_util.tree_leaves(b)))
            for b in in_batched
        ]
        foldable = fold_ok and all(
            batch_first[i] or not flags[i] for i in range(len(args)) if args[i] is not None
        )
        if foldable:
            folded = []
            for i, a in enumerate(args):
                if a is None or not batch_first[i]:
                    folded.append(a)
                    continue
                if not flags[i]:
                    a = jnp.broadcast_to(a, (axis_size, *a.shape))
                folded.append(a.reshape((axis_size * a.shape[1], *a.shape[2:])))
            outs = call(*folded)
            unfold = jax.tree_util.tree_map(
                lambda o: o.reshape((axis_size, o.shape[0] // axis_size, *o.shape[1:])), outs
            )
            return unfold, jax.tree_util.tree_map(lambda _: True, outs)
        mapped = [i for i in range(len(args)) if args[i] is not None and flags[i]]

        def one(xs: Any) -> Any:
            full = list(args)
            for i, x in zip(mapped, xs):
                full[i] = x
            return call(*full)

        outs = jax.lax.map(one, [args[i] for i in mapped])
        return outs, jax.tree_util.tree_map(lambda _: True, outs)

    return call


# ---------------------------------------------------------------------------------------------
# Trace-time checks: the core API's, on abstract arrays
# ---------------------------------------------------------------------------------------------


def _desc(x: Any, arg: str, f64_as: str | None = None) -> tuple[Any, ...]:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{arg}: expected a jax array, got {type(x).__name__}")
    shape = tuple(int(s) for s in x.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(shape[d + 1], 1)
    dt = np.dtype(x.dtype)
    name = f64_as if (f64_as and dt == _F64) else dt.name
    return (0, shape, tuple(strides), name, CUDA, 0)


def _is_f64(x: Any) -> bool:
    return np.dtype(x.dtype) == _F64


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def _attn_fwd_call(params: tuple[Any, ...], q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    scale, wl, wr, cap, _det = params
    b, sq, h, _ = q.shape
    results = (_sds(q.shape, q.dtype), _sds((b, h, sq), _F32))

    def gpu(q: Any, k: Any, v: Any) -> Any:
        return jax.ffi.ffi_call(TARGET_PREFIX + "flash_attn_fwd", results)(
            q,
            k,
            v,
            softmax_scale=np.float32(scale),
            window_left=np.int64(wl),
            window_right=np.int64(wr),
            softcap=np.float32(cap),
        )

    def host_fn(q: Any, k: Any, v: Any) -> Any:
        acc = _F64 if q.dtype == _F64 else _F32
        return reference.flash_attn_func(
            q, k, v, scale, False, (wl, wr), cap, return_lse=True, accum_dtype=acc
        )

    def host(q: Any, k: Any, v: Any) -> Any:
        return _host_call(host_fn, results, q, k, v)

    return tuple(_on_platform((q, k, v), None if _is_f64(q) else gpu, host))  # type: ignore[return-value]


def _attn_bwd_call(params: tuple[Any, ...], *arrays: Any) -> tuple[Any, Any, Any]:
    scale, wl, wr, cap, det = params
    dout, q, k, v, out, lse = arrays
    results = (_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(v.shape, v.dtype))

    def gpu(*a: Any) -> Any:
        return jax.ffi.ffi_call(TARGET_PREFIX + "flash_attn_bwd", results)(
            *a,
            softmax_scale=np.float32(scale),
            window_left=np.int64(wl),
            window_right=np.int64(wr),
            softcap=np.float32(cap),
            deterministic=np.int64(det),
        )

    def host_fn(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any) -> Any:
        acc = _F64 if q.dtype == _F64 else _F32
        return reference_bwd.flash_attn_bwd(
            dout, q, k, v, out, lse, scale, False, (wl, wr), cap, accum_dtype=acc
        )

    def host(*a: Any) -> Any:
        return _host_call(host_fn, results, *a)

    return tuple(_on_platform(arrays, None if _is_f64(q) else gpu, host))  # type: ignore[return-value]


def _attn_fwd_batched(params: tuple[Any, ...]) -> Callable[..., Any]:
    return _batched(lambda q, k, v: _attn_fwd_call(params, q, k, v), (True, True, True), True)


def _attn_bwd_batched(params: tuple[Any, ...]) -> Callable[..., Any]:
    return _batched(lambda *a: _attn_bwd_call(params, *a), (True,) * 6, True)


def _attention_primal(params: tuple[Any, ...], q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    return _attn_fwd_batched(params)(q, k, v)


def _attention_fwd(params: tuple[Any, ...], q: Any, k: Any, v: Any) -> Any:
    out, lse = _attn_fwd_batched(params)(q, k, v)
    return (out, lse), (q, k, v, out, lse)


def _attention_bwd(params: tuple[Any, ...], res: Any, cts: Any) -> Any:
    q, k, v, out, lse = res
    dout, _dlse = cts  # lse carries no gradient (as in flash-attn)
    dq, dk, dv = _attn_bwd_batched(params)(dout, q, k, v, out, lse)
    return dq, dk, dv


_attention = jax.custom_vjp(_attention_primal, nondiff_argnums=(0,))
_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
) -> Any:
    """flash-attn's `flash_attn_func` on jax arrays (see `flashscan.flash_attn_func`), under
    jit / grad / vmap. q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k,
    nheads_k, headdim). Returns out, or (out, lse) with return_lse (lse: (batch, nheads,
    seqlen_q) float32, no gradient). float64 runs the float64 reference (tests, any platform).
    """
    f64 = "float32" if _is_f64(q) else None
    dq, dk, dv = _desc(q, "q", f64), _desc(k, "k", f64), _desc(v, "v", f64)
    _b, _sq, _h, d, _sk, _hk = _checks.attention(dq, dk, dv)
    scale, wl, wr, cap, causal, return_lse = _checks.attention_options(
        d, causal, window_size, softmax_scale, softcap, return_lse
    )
    deterministic = _checks.flag("deterministic", deterministic)
    out, lse = _attention((scale, wl, wr, cap, deterministic), q, k, v)
    return (out, jax.lax.stop_gradient(lse)) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------


def _saved_count(seqlen: int) -> int:
    return max((seqlen + _SAVE_CHUNK - 1) // _SAVE_CHUNK - 1, 0)


def _scan_bits(opt: Sequence[Any]) -> int:
    bits = 0
    for bit, a in zip((_SCAN_D, _SCAN_Z, _SCAN_BIAS, _SCAN_INIT), opt):
        if a is not None:
            bits |= bit
    return bits


def _scan_fwd_call(softplus: bool, save: bool, *arrays: Any) -> tuple[Any, ...]:
    """(out, last_state[, saved_states]) for arrays (u, delta, A, B, C, D, z, delta_bias,
    initial_state); saved_states (GPU only) when `save` and the sequence has chunks."""
    u, delta, A, B, C, *opt = arrays
    batch, dim, seqlen = u.shape
    dstate = A.shape[-1]
    f64 = _is_f64(u)
    acc = _F64 if f64 else _F32
    nsaved = _saved_count(seqlen)
    results = [_sds(u.shape, u.dtype), _sds((batch, dim, dstate), acc)]
    with_saved = save and nsaved > 0 and not f64 and _gpu_targets()
    if with_saved:
        results.append(_sds((batch, dim, nsaved, dstate), _F32))
    present = [a for a in arrays if a is not None]
    bits = _scan_bits(opt)

    def gpu(*a: Any) -> Any:
        return jax.ffi.ffi_call(TARGET_PREFIX + "selective_scan_fwd", results)(
            *a, delta_softplus=np.int64(softplus), optional=np.int64(bits)
        )

    def host_fn(*a: Any) -> Any:
        full = _unpack(a, arrays)
        out, last = reference.selective_scan_fn(
            *full[:8], delta_softplus=softplus, return_last_state=True, initial_state=full[8]
        )
        # The saved states only speed up the GPU backward; the host backward ignores them.
        return (out, last, np.zeros(results[2].shape, np.float32)) if with_saved else (out, last)

    def host(*a: Any) -> Any:
        return _host_call(host_fn, tuple(results), *a)

    return tuple(_on_platform(present, None if f64 else gpu, host))


def _unpack(present: Sequence[Any], like: Sequence[Any]) -> list[Any]:
    """The full argument list (None where `like` has None) from the present arrays."""
    it = iter(present)
    return [None if x is None else next(it) for x in like]


def _scan_bwd_call(softplus: bool, *arrays: Any) -> tuple[Any, ...]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state; None where the
    input is None) for arrays (u, delta, A, B, C, D, z, delta_bias, initial_state, dout,
    saved_states, dlast_state)."""
    u, delta, A, B, C, D, z, bias, init, dout, saved, dlast = arrays
    ins = (u, delta, A, B, C, D, z, bias, init)
    f64 = _is_f64(u)
    # the kernels' gradient dtypes: du, ddelta, dz like their inputs; the weights' float32
    kernel_dt = [
        u.dtype,
        delta.dtype,
        _F32,
        _F32,
        _F32,
        _F32,
        None if z is None else z.dtype,
        _F32,
        _F32,
    ]
    results = tuple(
        _sds(x.shape, x.dtype if f64 else dt) for x, dt in zip(ins, kernel_dt) if x is not None
    )
    bits = _scan_bits((D, z, bias, init))
    if saved is not None:
        bits |= _SCAN_SAVED
    if dlast is not None:
        bits |= _SCAN_DLAST
    present = [a for a in arrays if a is not None]

    def gpu(*a: Any) -> Any:
        return jax.ffi.ffi_call(TARGET_PREFIX + "selective_scan_bwd", results)(
            *a, delta_softplus=np.int64(softplus), optional=np.int64(bits)
        )

    def host_fn(*a: Any) -> Any:
        u, delta, A, B, C, D, z, bias, init, dout, _saved, dlast = _unpack(a, arrays)
        grads = reference_bwd.selective_scan_bwd(
            dout, u, delta, A, B, C, D, z, bias, softplus, init, dlast
        )
        return tuple(g for g in grads if g is not None)

    def host(*a: Any) -> Any:
        return _host_call(host_fn, results, *a)

    flat = iter(_on_platform(present, None if f64 else gpu, host))
    return tuple(None if x is None else next(flat).astype(x.dtype) for x in ins)


def _scan_batch_first(arrays: Sequence[Any]) -> tuple[Any, ...]:
    """Which scan operands lead with the batch axis: u, delta, z, initial_state, varying B / C,
    dout, saved_states, dlast_state; not A, fixed B / C, D, delta_bias."""
    u, delta, A, B, C, D, z, bias, init, *rest = arrays
    flags = [True, True, False, B.ndim >= 3, C.ndim >= 3, False, True, False, True]
    flags += [True] * len(rest)
    return tuple(None if a is None else f for a, f in zip(arrays, flags))


def _scan_primal(static: tuple[bool, bool], *arrays: Any) -> Any:
    softplus, _save = static
    fwd = _batched(lambda *a: _scan_fwd_call(softplus, False, *a), _scan_batch_first(arrays), True)
    return fwd(*arrays)[:2]


def _scan_fwd(static: tuple[bool, bool], *arrays: Any) -> Any:
    softplus, save = static
    fwd = _batched(lambda *a: _scan_fwd_call(softplus, save, *a), _scan_batch_first(arrays), True)
    outs = fwd(*arrays)
    saved = outs[2] if len(outs) == 3 else None
    return (outs[0], outs[1]), (arrays, saved)


def _scan_bwd(static: tuple[bool, bool], res: Any, cts: Any) -> Any:
    softplus, _save = static
    arrays, saved = res
    dout, dlast = cts
    full = (*arrays, dout, saved, dlast.astype(_F64 if _is_f64(arrays[0]) else _F32))
    # weight gradients sum over the batch: a vmapped backward runs one call per example
    bwd = _batched(lambda *a: _scan_bwd_call(softplus, *a), _scan_batch_first(full), False)
    return bwd(*full)


_scan = jax.custom_vjp(_scan_primal, nondiff_argnums=(0,))
_scan.defvjp(_scan_fwd, _scan_bwd)


def selective_scan_fn(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: Any = None,
) -> Any:
    """mamba_ssm's `selective_scan_fn` on jax arrays (see `flashscan.selective_scan_fn`), under
    jit / grad / vmap. Returns out, or (out, last_state) with return_last_state (last_state
    float32 (batch, dim, dstate), differentiable; `initial_state` too)."""
    f64 = "float32" if _is_f64(u) else None
    descs = [
        None if x is None else _desc(x, n, f64)
        for x, n in (
            (u, "u"),
            (delta, "delta"),
            (A, "A"),
            (B, "B"),
            (C, "C"),
            (D, "D"),
            (z, "z"),
            (delta_bias, "delta_bias"),
            (initial_state, "initial_state"),
        )
    ]
    _checks.selective_scan(*descs)
    softplus = _checks.flag("delta_softplus", delta_softplus)
    return_last_state = _checks.flag("return_last_state", return_last_state)
    if u.shape[2] == 0:
        raise ValueError("u: seqlen 0 has nothing to scan (flashscan.jax needs seqlen >= 1)")
    out, last = _scan((softplus, True), u, delta, A, B, C, D, z, delta_bias, initial_state)
    return (out, last) if return_last_state else out


# ---------------------------------------------------------------------------------------------
# Selective state update (one decode step; no gradient)
# ---------------------------------------------------------------------------------------------


def _update_call(softplus: bool, *arrays: Any) -> tuple[Any, Any]:
    state, x, dt, A, B, C, D, z, bias = arrays
    results = (_sds(x.shape, x.dtype), _sds(state.shape, state.dtype))
    bits = sum(bit for bit, a in zip((_UPD_D, _UPD_Z, _UPD_BIAS), (D, z, bias)) if a is not None)
    present = [a for a in arrays if a is not None]
    f64 = _is_f64(state) or _is_f64(x)

    def gpu(*a: Any) -> Any:
        # the state is updated in place in XLA's buffer for it (donate it under jit to skip
        # the copy XLA makes otherwise)
        return jax.ffi.ffi_call(
            TARGET_PREFIX + "selective_state_update", results, input_output_aliases={0: 1}
        )(*a, dt_softplus=np.int64(softplus), optional=np.int64(bits))

    def host_fn(*a: Any) -> Any:
        full = _unpack(a, arrays)
        st = np.array(full[0], copy=True)
        out = reference.selective_state_update(st, *full[1:], dt_softplus=softplus)
        return out, st

    def host(*a: Any) -> Any:
        return _host_call(host_fn, results, *a)

    return tuple(_on_platform(present, None if f64 else gpu, host))  # type: ignore[return-value]


def selective_state_update(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]:
    """mamba_ssm's `selective_state_update` on jax arrays, functionally: returns
    (out, new_state) instead of updating `state` in place (under jit with `state` donated,
    XLA updates its buffer in place). Shapes as `flashscan.selective_state_update`. No
    gradient: differentiating it raises TypeError."""
    f64 = "float32" if _is_f64(state) else None
    descs = [
        None if a is None else _desc(a, n, f64)
        for a, n in (
            (state, "state"),
            (x, "x"),
            (dt, "dt"),
            (A, "A"),
            (B, "B"),
            (C, "C"),
            (D, "D"),
            (z, "z"),
            (dt_bias, "dt_bias"),
        )
    ]
    _checks.state_update(*descs)
    softplus = _checks.flag("dt_softplus", dt_softplus)
    arrays = (state, x, dt, A, B, C, D, z, dt_bias)
    # B, C ((batch, dstate) or (batch, ngroups, dstate)) lead with the batch; A, D, dt_bias not
    first = (True, True, True, False, True, True, False, True, False)
    call = _batched(
        lambda *a: _update_call(softplus, *a),
        tuple(None if a is None else f for a, f in zip(arrays, first)),
        True,
    )
    return _no_gradient(call, "selective_state_update")(*arrays)


def _no_gradient(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn` that says clearly, when differentiated, that it has no gradient."""
    wrapped = jax.custom_jvp(fn)

    def jvp(primals: Any, tangents: Any) -> Any:
        raise TypeError(
            f"flashscan.jax.{name} has no gradient (a decode step); train with "
            f"selective_scan_fn, or pass its inputs through jax.lax.stop_gradient"
        )

    wrapped.defjvp(jvp)
    return wrapped
