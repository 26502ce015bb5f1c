"""Mamba's selective scan (`selective_scan_fn`) and its one-step decode update
(`selective_state_update`), on the CUDA backend or the NumPy reference.

Dispatch as in `attention`: checks, then CUDA arrays on a served device -> `_native` on the
caller's current stream; CPU arrays -> the reference; CUDA arrays the backend cannot serve ->
the fallback policy, then the reference on the host.
"""

from __future__ import annotations

from typing import Any

from . import _backend, _checks, reference
from ._frameworks import _HANDLERS, CUDA, Desc, Handler, _resolve

__all__ = ["selective_scan_fn", "selective_state_update"]

_native = _backend.native
_usable_devices = _backend.usable_devices

_SCAN_ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
_SSU_ARGS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")


def _mixed(
    objs: tuple[Any, ...], names: tuple[str, ...]
) -> tuple[tuple[Handler | None, ...], tuple[Desc | None, ...], tuple[Any, ...]]:
    """Handlers, descriptors and native arguments of arrays of several frameworks (None stays
    None). The slow path: the usual call has one framework and is described inline."""
    hs: list[Handler | None] = []
    ds: list[Desc | None] = []
    na: list[Any] = []
    for o, name in zip(objs, names):
        if o is None:
            hs.append(None)
            ds.append(None)
            na.append(None)
            continue
        h = _HANDLERS.get(type(o)) or _resolve(o, name)
        d = h.describe(o, name)
        hs.append(h)
        ds.append(d)
        na.append(d if h.fast else o)
    return tuple(hs), tuple(ds), tuple(na)


def _flag(arg: str, value: Any) -> bool:
    if value is True or value is False:
        return value
    return _checks.flag(arg, value)


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
) -> Any | tuple[Any, Any]:
    """Selective scan with mamba_ssm's names, shapes and math.

    u, delta, z: (batch, dim, seqlen) in float16, bfloat16 or float32 (one dtype), seqlen
    contiguous; A: (dim, dstate) float32, dstate 1..256; B, C: (dim, dstate) fixed over time,
    or (batch, dstate, seqlen) / (batch, ngroups, dstate, seqlen) varying (ngroups divides dim;
    varying B and C share ngroups), in u's dtype or float32; D, delta_bias: (dim,) float32;
    initial_state: (batch, dim, dstate) float32 (flashscan's addition: scan a stream chunk by
    chunk by passing the previous chunk's last state).

    Per (batch, channel d, state n), t = 0..seqlen-1: dt = delta + delta_bias (softplus if
    delta_softplus); x = exp(dt * A[d, n]) * x + dt * B[n, t] * u[t];
    y[t] = sum_n C[n, t] * x + D[d] * u[t]; out = y * silu(z) when z is given.
    State and accumulation in float32.

    Returns out (batch, dim, seqlen) in u's dtype, or (out, last_state) with
    return_last_state=True (last_state (batch, dim, dstate) float32), in u's framework.
    """
    tu = type(u)
    hu = _HANDLERS.get(tu) or _resolve(u, "u")
    objs = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    if (
        type(delta) is tu
        and type(A) is tu
        and type(B) is tu
        and type(C) is tu
        and (D is None or type(D) is tu)
        and (z is None or type(z) is tu)
        and (delta_bias is None or type(delta_bias) is tu)
        and (initial_state is None or type(initial_state) is tu)
    ):
        f = hu.describe
        descs = (
            f(u, "u"),
            f(delta, "delta"),
            f(A, "A"),
            f(B, "B"),
            f(C, "C"),
            None if D is None else f(D, "D"),
            None if z is None else f(z, "z"),
            None if delta_bias is None else f(delta_bias, "delta_bias"),
            None if initial_state is None else f(initial_state, "initial_state"),
        )
        hands: tuple[Handler | None, ...] = (hu,) * 9
        nargs = descs if hu.fast else objs
    else:
        hands, descs, nargs = _mixed(objs, _SCAN_ARGS)
    du = descs[0]
    assert du is not None
    batch, dim, seqlen, dstate = _checks.selective_scan_memo(*descs)  # type: ignore[arg-type]
    delta_softplus = _flag("delta_softplus", delta_softplus)
    return_last_state = _flag("return_last_state", return_last_state)

    if du[4] == CUDA and batch and dim and seqlen:
        if du[5] in _usable_devices():
            # --- the hot path -------------------------------------------------------------
            out = hu.empty(du[1], du[3], u, du)
            last = None
            if return_last_state:
                last = hu.empty((batch, dim, dstate), "float32", u, du)
            fast = hu.fast
            _native.selective_scan_fwd(  # type: ignore[union-attr]
                *nargs,
                hu.describe_new(out, du[1], du[3], du) if fast else out,
                None
                if last is None
                else (hu.describe_new(last, (batch, dim, dstate), "float32", du) if fast else last),
                delta_softplus,
                hu.stream(du[5]),
            )
            if hu.needs_finish:
                out = hu.finish(out)
                if last is not None:
                    last = hu.finish(last)
            return (out, last) if return_last_state else out
        _backend.on_fallback("selective_scan_fn", _backend.device_reason(du[5]))

    # CPU arrays, empty problems, or the fallback: the reference on host copies.
    host = [None if o is None else h.to_host(o) for o, h in zip(objs, hands)]  # type: ignore[union-attr]
    y, x_last = reference.selective_scan_fn(
        *host[:8],
        delta_softplus=delta_softplus,
        return_last_state=True,
        initial_state=host[8],
    )
    out = hu.from_host(y, du[3], u, du)
    if not return_last_state:
        return out
    return out, hu.from_host(x_last, "float32", u, du)


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
) -> Any:
    """One decode step of the selective scan, mamba_ssm's `selective_state_update`.

    state: (batch, dim, dstate) or (batch, nheads, dim, dstate) float32, updated IN PLACE
    (the caller's array changes, nothing else does); x, dt, z: (batch, dim) or
    (batch, nheads, dim) in float16, bfloat16 or float32 (one dtype); A: (dim, dstate) or
    (nheads, dim, dstate) float32; B, C: (batch, dstate) or (batch, ngroups, dstate) (ngroups
    divides nheads) in x's dtype or float32; D, dt_bias: (dim,) or (nheads, dim) float32.

    dt = dt + dt_bias (softplus if dt_softplus); state = state * exp(dt * A) + dt * B * x;
    out = sum_n state * C + D * x, times silu(z) when z is given.
    Returns out (like x) in x's framework.
    """
    tx = type(x)
    hx = _HANDLERS.get(tx) or _resolve(x, "x")
    objs = (state, x, dt, A, B, C, D, z, dt_bias)
    if (
        type(state) is tx
        and type(dt) is tx
        and type(A) is tx
        and type(B) is tx
        and type(C) is tx
        and (D is None or type(D) is tx)
        and (z is None or type(z) is tx)
        and (dt_bias is None or type(dt_bias) is tx)
    ):
        f = hx.describe
        descs = (
            f(state, "state"),
            f(x, "x"),
            f(dt, "dt"),
            f(A, "A"),
            f(B, "B"),
            f(C, "C"),
            None if D is None else f(D, "D"),
            None if z is None else f(z, "z"),
            None if dt_bias is None else f(dt_bias, "dt_bias"),
        )
        hands: tuple[Handler | None, ...] = (hx,) * 9
        nargs = descs if hx.fast else objs
    else:
        hands, descs, nargs = _mixed(objs, _SSU_ARGS)
    dx = descs[1]
    assert dx is not None
    batch, nheads, dim, _, _ = _checks.state_update_memo(*descs)  # type: ignore[arg-type]
    hs = hands[0]
    assert hs is not None
    if not hs.always_writable:
        _checks.writable("state", state, hs)
    dt_softplus = _flag("dt_softplus", dt_softplus)

    if dx[4] == CUDA and batch and nheads and dim:
        if dx[5] in _usable_devices():
            # --- the hot path -------------------------------------------------------------
            out = hx.empty(dx[1], dx[3], x, dx)
            _native.selective_state_update(  # type: ignore[union-attr]
                *nargs,
                hx.describe_new(out, dx[1], dx[3], dx) if hx.fast else out,
                dt_softplus,
                hx.stream(dx[5]),
            )
            return hx.finish(out) if hx.needs_finish else out
        _backend.on_fallback("selective_state_update", _backend.device_reason(dx[5]))

    # CPU arrays, empty problems, or the fallback: the reference on host copies; the new
    # state is written back into the caller's array (a no-op where the host copy is a view).
    host = [None if o is None else h.to_host(o) for o, h in zip(objs, hands)]  # type: ignore[union-attr]
    y = reference.selective_state_update(*host, dt_softplus=dt_softplus)
    hs.copy_into(state, host[0])
    return hx.from_host(y, dx[3], x, dx)
