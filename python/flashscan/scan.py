"""Mamba's selective scan (`selective_scan_fn`) and its one-step decode update
(`selective_state_update`), on the CUDA backend or the NumPy reference.

Dispatch as in `attention`: checks, then CUDA arrays on a served device -> `_native` on the
caller's current stream; CPU arrays -> the reference; CUDA arrays the backend cannot serve ->
the fallback policy, then the reference on the host. As there, a torch call whose signature
(every tensor's shape, strides, dtype and device; None for an absent optional) was checked and
served before takes the hot path: one read of each tensor, one allocation, the `_native` call.
Everything else goes through the general functions (`_scan_any`, `_state_update_any`), which
check, raise and fall back as they always have and record the plans.
"""

from __future__ import annotations

from typing import Any

from . import _backend, _checks, _routes, reference
from ._frameworks import (
    _HANDLERS,
    CUDA,
    TORCH_TYPES,
    Desc,
    Handler,
    _resolve,
    grad_enabled,
    needs_autograd,
)

__all__ = ["selective_scan_fn", "selective_state_update"]

_native = _backend.native
_usable_devices = _backend.usable_devices
_NO_DEVICES: frozenset[int] = frozenset()

# signature -> plan (see `_plan`), one dict per operation, bounded like the check memos, and
# the last (signature, plan) pair found there (compared first: no hashing in a run of
# same-signature calls). Replaced whole, never mutated: thread-safe.
_SCAN_PLANS: dict[Any, tuple[Any, ...]] = {}
_SSU_PLANS: dict[Any, tuple[Any, ...]] = {}
_SCAN_LAST: tuple[Any, Any] = (None, None)
_SSU_LAST: tuple[Any, Any] = (None, None)

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


def _describe_all(
    objs: tuple[Any, ...], names: tuple[str, ...], required: int, h: Handler, t: type
) -> tuple[tuple[Handler | None, ...], tuple[Desc | None, ...], tuple[Any, ...]]:
    """Handlers, descriptors and native arguments of a call's arrays: the usual call has one
    framework (every array of type `t`, described by `h`); several frameworks go to `_mixed`.
    The first `required` arrays may not be None."""
    for o, name in zip(objs[:required], names):
        if o is None:
            _resolve(o, name)  # raises the TypeError naming the argument
    if all(o is None or type(o) is t for o in objs):
        f = h.describe
        descs = tuple(None if o is None else f(o, n) for o, n in zip(objs, names))
        return (h,) * len(objs), descs, descs if h.fast else objs
    return _mixed(objs, names)


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
    global _SCAN_LAST, _SERVE
    serve = _SERVE
    if serve is not None and not _is_compiling():
        # a planned signature in one native call (None: not one it serves)
        r = serve(
            u,
            delta,
            A,
            B,
            C,
            D,
            z,
            delta_bias,
            initial_state,
            delta_softplus,
            return_last_state,
            False,
        )
        if r is not None:
            return r
    key = scan_key(u, delta, A, B, C, D, z, delta_bias, initial_state)
    if key is not None:
        seen = _SCAN_LAST
        if key == seen[0]:
            plan = seen[1]
        else:
            plan = _SCAN_PLANS.get(key)
            if plan is not None:
                _SCAN_LAST = (key, plan)
        if (
            plan is not None
            and plan[0] in (_backend._usable or _NO_DEVICES)
            and not (
                (
                    u.requires_grad
                    or delta.requires_grad
                    or A.requires_grad
                    or B.requires_grad
                    or C.requires_grad
                    or (D is not None and D.requires_grad)
                    or (z is not None and z.requires_grad)
                    or (delta_bias is not None and delta_bias.requires_grad)
                    or (initial_state is not None and initial_state.requires_grad)
                )
                and grad_enabled()
            )
        ):
            # --- the hot path: a signature already checked and served -------------------------
            if delta_softplus is not True and delta_softplus is not False:
                delta_softplus = _checks.flag("delta_softplus", delta_softplus)
            if return_last_state is not True and return_last_state is not False:
                return_last_state = _checks.flag("return_last_state", return_last_state)
            server = _SERVER if _SERVER is not None else _make_server()
            if server:
                # a checked signature, planned natively from now on where it can be
                r = server.serve(
                    u,
                    delta,
                    A,
                    B,
                    C,
                    D,
                    z,
                    delta_bias,
                    initial_state,
                    delta_softplus,
                    return_last_state,
                    True,
                )
                if r is not None:
                    _SERVE = server.serve
                    return r
            out, last = serve_scan(
                plan,
                key,
                u,
                delta,
                A,
                B,
                C,
                D,
                z,
                delta_bias,
                initial_state,
                delta_softplus,
                return_last_state,
            )
            return (out, last) if return_last_state else out
    return _scan_any(
        u,
        delta,
        A,
        B,
        C,
        D,
        z,
        delta_bias,
        delta_softplus,
        return_last_state,
        initial_state,
        key,
    )


# The native server of planned torch signatures (`_native.ScanServer`: one native call per
# hot call, see src/serve/), made on the first hot call; False where this build has
# none. `_SERVE` is its `serve` once it has served a call: `selective_scan_fn` tries it first.
_SERVER: Any = None
_SERVE: Any = None

# torch.compiler.is_compiling once a server exists (see `_backend.make_server`)
_is_compiling: Any = _backend.never


def _make_server() -> Any:
    """The server, made now; None (asked again next time) while `_native` is not the real
    module (tests swap in fakes that record every call)."""
    global _SERVER, _is_compiling
    server, compiling = _backend.make_server(_native, "ScanServer", grad=True)
    if server is not None:
        _SERVER = server
    if compiling is not None:
        _is_compiling = compiling
    return server


# The same for `selective_state_update` (`_native.StateUpdateServer`).
_SSU_SERVER: Any = None
_SSU_SERVE: Any = None


def _make_ssu_server() -> Any:
    """As `_make_server`, for the state update."""
    global _SSU_SERVER, _is_compiling
    server, compiling = _backend.make_server(_native, "StateUpdateServer", grad=False)
    if server is not None:
        _SSU_SERVER = server
    if compiling is not None:
        _is_compiling = compiling
    return server


def scan_key(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    z: Any,
    delta_bias: Any,
    initial_state: Any,
) -> tuple[Any, ...] | None:
    """The signature of a scan call whose arrays are all torch tensors (None for an absent
    optional): each tensor's shape, strides, dtype and device, in argument order, 4 entries
    for each of u, delta, A, B, C (index 0, 4, 8, 12, 16) then one (shape, strides, dtype,
    device) entry or None for each of D, z, delta_bias, initial_state (index 20..23). None
    when an array is not a torch tensor or has no strides (the general path says why). What
    `_SCAN_PLANS` is keyed by, here and in `flashscan.torch`."""
    if not (
        type(u) in TORCH_TYPES
        and type(delta) in TORCH_TYPES
        and type(A) in TORCH_TYPES
        and type(B) in TORCH_TYPES
        and type(C) in TORCH_TYPES
        and (D is None or type(D) in TORCH_TYPES)
        and (z is None or type(z) in TORCH_TYPES)
        and (delta_bias is None or type(delta_bias) in TORCH_TYPES)
        and (initial_state is None or type(initial_state) in TORCH_TYPES)
    ):
        return None
    try:
        return (
            u.shape,
            u.stride(),
            u.dtype,
            u.device,
            delta.shape,
            delta.stride(),
            delta.dtype,
            delta.device,
            A.shape,
            A.stride(),
            A.dtype,
            A.device,
            B.shape,
            B.stride(),
            B.dtype,
            B.device,
            C.shape,
            C.stride(),
            C.dtype,
            C.device,
            None if D is None else (D.shape, D.stride(), D.dtype, D.device),
            None if z is None else (z.shape, z.stride(), z.dtype, z.device),
            None
            if delta_bias is None
            else (delta_bias.shape, delta_bias.stride(), delta_bias.dtype, delta_bias.device),
            None
            if initial_state is None
            else (
                initial_state.shape,
                initial_state.stride(),
                initial_state.dtype,
                initial_state.device,
            ),
        )
    except Exception:  # no strides (sparse, nested...): the general path says what is wrong
        return None


def input_ptrs(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    z: Any,
    delta_bias: Any,
    initial_state: Any,
) -> tuple[int, ...]:
    """The raw pointers of a scan call's torch inputs in `_native`'s order (0 for an absent
    optional): what a replay plan's `launch` takes first, forward and backward."""
    return (
        u.data_ptr(),
        delta.data_ptr(),
        A.data_ptr(),
        B.data_ptr(),
        C.data_ptr(),
        0 if D is None else D.data_ptr(),
        0 if z is None else z.data_ptr(),
        0 if delta_bias is None else delta_bias.data_ptr(),
        0 if initial_state is None else initial_state.data_ptr(),
    )


def serve_scan(
    plan: tuple[Any, ...],
    key: tuple[Any, ...],
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    z: Any,
    delta_bias: Any,
    initial_state: Any,
    delta_softplus: bool,
    return_last_state: bool,
    saved_desc: Desc | None = None,
) -> tuple[Any, Any]:
    """The hot path's work for torch tensors of signature `key` with its `plan` (checked and
    served before, on a usable device; flags already bools): allocate out (and the last state
    when asked), call `_native.selective_scan_fwd` with descriptor tuples on the current
    stream. `saved_desc`: the descriptor of the (batch, dim, nsaved >= 1, dstate) float32
    buffer the forward fills for a backward (`_scan_any`'s saved_states), or None. Returns
    (out, last state or None). After its first call with given flags a signature is
    launched through its replay plan (`_native.ScanFwdReplay`: raw pointers, no descriptors,
    no checks; the signature was checked when it was planned)."""
    dev, dts, dtb, dtc, o_shape, o_strides, l_shape, l_strides, stream, f32, replays = plan
    out = u.new_empty_strided(o_shape, o_strides)
    if return_last_state:
        last = u.new_empty_strided(l_shape, l_strides, dtype=f32)
    else:
        last = None
    rk = (0, return_last_state, saved_desc is not None, delta_softplus)
    replay = replays.get(rk)
    if replay:
        replay.launch(
            *input_ptrs(u, delta, A, B, C, D, z, delta_bias, initial_state),
            out.data_ptr(),
            0 if last is None else last.data_ptr(),
            0 if saved_desc is None else saved_desc[0],
            stream(dev),
        )
        return out, last
    la = None if last is None else (last.data_ptr(), l_shape, l_strides, "float32", CUDA, dev)
    m = key[20]
    dD = None if m is None else (D.data_ptr(), m[0], m[1], "float32", CUDA, dev)
    m = key[21]
    dz = None if m is None else (z.data_ptr(), m[0], m[1], dts, CUDA, dev)
    m = key[22]
    db = None if m is None else (delta_bias.data_ptr(), m[0], m[1], "float32", CUDA, dev)
    m = key[23]
    di = None if m is None else (initial_state.data_ptr(), m[0], m[1], "float32", CUDA, dev)
    du = (u.data_ptr(), key[0], key[1], dts, CUDA, dev)
    dd = (delta.data_ptr(), key[4], key[5], dts, CUDA, dev)
    da = (A.data_ptr(), key[8], key[9], "float32", CUDA, dev)
    dB = (B.data_ptr(), key[12], key[13], dtb, CUDA, dev)
    dC = (C.data_ptr(), key[16], key[17], dtc, CUDA, dev)
    do = (out.data_ptr(), o_shape, o_strides, dts, CUDA, dev)
    if replay is None and len(replays) < REPLAYS_PER_PLAN:
        # plan the replay of these flags (checked, nothing launched; False: not one launch)
        kw = {} if saved_desc is None else {"saved_states": saved_desc}
        replays[rk] = (
            _native.selective_scan_fwd(  # type: ignore[union-attr]
                du, dd, da, dB, dC, dD, dz, db, di, do, la, delta_softplus, None, replay=True, **kw
            )
            or False
        )
    if saved_desc is None:
        _native.selective_scan_fwd(  # type: ignore[union-attr]
            du, dd, da, dB, dC, dD, dz, db, di, do, la, delta_softplus, stream(dev)
        )
    else:
        _native.selective_scan_fwd(  # type: ignore[union-attr]
            du,
            dd,
            da,
            dB,
            dC,
            dD,
            dz,
            db,
            di,
            do,
            la,
            delta_softplus,
            stream(dev),
            saved_states=saved_desc,
        )
    return out, last


def _plan(
    h: Any,
    dx: Desc,
    dtb: str,
    dtc: str,
    o_shape: tuple[int, ...],
    l_shape: tuple[int, int, int] | None,
) -> tuple[Any, ...]:
    """What a hot path needs for a checked torch signature: the device, the dtype names of the
    sequence arrays (u / x), B and C, the output's shape (like u / x; 2-D or 3-D, every size
    >= 1) and contiguous strides (what `new_empty` would give), the last state's (3-D, or
    None), the stream lookup, torch.float32, and an empty dict for the native replay plans of
    this signature (`_native.ScanFwdReplay` / `ScanBwdReplay` by call flags, kept by the scan's
    hot paths). Cheap: a signature that never repeats pays for it on every call."""
    if len(o_shape) == 3:
        o_strides: tuple[int, ...] = (o_shape[1] * o_shape[2], o_shape[2], 1)
    else:
        o_strides = (o_shape[1], 1)
    return (
        dx[5],
        dx[3],
        dtb,
        dtc,
        o_shape,
        o_strides,
        l_shape,
        None if l_shape is None else (l_shape[1] * l_shape[2], l_shape[2], 1),
        h.current_stream,
        h.float32,
        {},
    )


# replay plans kept per signature and call flags, at most this many (dout strides may vary)
REPLAYS_PER_PLAN = 8


def _saved_kw(h: Handler, saved: Any) -> dict[str, Any]:
    """`saved_states=` for `_native.selective_scan_fwd`, or nothing when there is nothing to
    save (the usual call)."""
    if saved is None:
        return {}
    d = h.describe(saved, "saved_states")
    if not d[1][2]:
        return {}
    return {"saved_states": d if h.fast else saved}


def _scan_any(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    z: Any,
    delta_bias: Any,
    delta_softplus: Any,
    return_last_state: Any,
    initial_state: Any,
    key: Any,
    route: bool = True,
    saved_states: Any = None,
) -> Any | tuple[Any, Any]:
    """The general path of `selective_scan_fn`: any framework, every check; records the plan
    of a torch signature (`key`, not None when every array is a torch tensor) it sends to the
    GPU. With `route`, torch calls that need gradients go to the differentiable op registered
    in `_routes` (by `flashscan.torch`, whose op comes back here with route=False).
    `saved_states` ((batch, dim, nsaved, dstate) float32, like u, nsaved =
    `_native.scan_saved_state_count(seqlen)`): filled on the GPU with the state after every
    saved chunk, for a backward to come; left as it is on the host path."""
    hu = _HANDLERS.get(type(u)) or _resolve(u, "u")
    objs = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    if route and needs_autograd(hu, objs):
        return _routes.differentiable("selective_scan_fn")(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state
        )
    hands, descs, nargs = _describe_all(objs, _SCAN_ARGS, 5, hu, type(u))
    du = descs[0]
    assert du is not None
    # a torch signature served once goes to a plan: the check memo would only duplicate it
    check = _checks.selective_scan if key is not None else _checks.selective_scan_memo
    batch, dim, seqlen, dstate = check(*descs)  # type: ignore[arg-type]
    delta_softplus = _flag("delta_softplus", delta_softplus)
    return_last_state = _flag("return_last_state", return_last_state)

    if du[4] == CUDA and batch and dim and seqlen:
        if du[5] in _usable_devices():
            # --- the GPU, general path ------------------------------------------------------
            if key is not None:
                _checks.remember(
                    _SCAN_PLANS,
                    key,
                    _plan(
                        hu,
                        du,
                        descs[3][3],  # type: ignore[index]
                        descs[4][3],  # type: ignore[index]
                        (batch, dim, seqlen),
                        (batch, dim, dstate),
                    ),
                )
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
                **_saved_kw(hu, saved_states),
            )
            if hu.needs_finish:
                out = hu.finish(out)
                if last is not None:
                    last = hu.finish(last)
            return (out, last) if return_last_state else out
        _backend.on_fallback("selective_scan_fn", _backend.device_reason(du[5]), depth=2)

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
    global _SSU_LAST, _SSU_SERVE
    serve = _SSU_SERVE
    if serve is not None and not _is_compiling():
        # a planned signature in one native call (None: not one it serves)
        r = serve(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, False)
        if r is not None:
            return r
    key = None
    if (
        type(state) in TORCH_TYPES
        and type(x) in TORCH_TYPES
        and type(dt) in TORCH_TYPES
        and type(A) in TORCH_TYPES
        and type(B) in TORCH_TYPES
        and type(C) in TORCH_TYPES
        and (D is None or type(D) in TORCH_TYPES)
        and (z is None or type(z) in TORCH_TYPES)
        and (dt_bias is None or type(dt_bias) in TORCH_TYPES)
    ):
        try:
            key = (
                state.shape,
                state.stride(),
                state.dtype,
                state.device,
                x.shape,
                x.stride(),
                x.dtype,
                x.device,
                dt.shape,
                dt.stride(),
                dt.dtype,
                dt.device,
                A.shape,
                A.stride(),
                A.dtype,
                A.device,
                B.shape,
                B.stride(),
                B.dtype,
                B.device,
                C.shape,
                C.stride(),
                C.dtype,
                C.device,
                None if D is None else (D.shape, D.stride(), D.dtype, D.device),
                None if z is None else (z.shape, z.stride(), z.dtype, z.device),
                None
                if dt_bias is None
                else (dt_bias.shape, dt_bias.stride(), dt_bias.dtype, dt_bias.device),
            )
        except Exception:  # no strides (sparse, nested...): the general path says what is wrong
            key = None
        seen = _SSU_LAST
        if key == seen[0]:
            plan = seen[1]
        else:
            plan = _SSU_PLANS.get(key)
            if plan is not None:
                _SSU_LAST = (key, plan)
        if plan is not None and plan[0] in (_backend._usable or _NO_DEVICES):
            # --- the hot path: a signature already checked and served -------------------------
            # (torch tensors are always writable: the state needs no per-call check)
            dev, dts, dtb, dtc, o_shape, o_strides, _, _, stream, _, _ = plan
            if dt_softplus is not True and dt_softplus is not False:
                dt_softplus = _checks.flag("dt_softplus", dt_softplus)
            server = _SSU_SERVER if _SSU_SERVER is not None else _make_ssu_server()
            if server:
                # a checked signature, served natively from now on where it can be
                r = server.serve(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, True)
                if r is not None:
                    _SSU_SERVE = server.serve
                    return r
            out = x.new_empty_strided(o_shape, o_strides)
            m = key[24]
            dD = None if m is None else (D.data_ptr(), m[0], m[1], "float32", CUDA, dev)
            m = key[25]
            dz = None if m is None else (z.data_ptr(), m[0], m[1], dts, CUDA, dev)
            m = key[26]
            db = None if m is None else (dt_bias.data_ptr(), m[0], m[1], "float32", CUDA, dev)
            _native.selective_state_update(  # type: ignore[union-attr]
                (state.data_ptr(), key[0], key[1], "float32", CUDA, dev),
                (x.data_ptr(), key[4], key[5], dts, CUDA, dev),
                (dt.data_ptr(), key[8], key[9], dts, CUDA, dev),
                (A.data_ptr(), key[12], key[13], "float32", CUDA, dev),
                (B.data_ptr(), key[16], key[17], dtb, CUDA, dev),
                (C.data_ptr(), key[20], key[21], dtc, CUDA, dev),
                dD,
                dz,
                db,
                (out.data_ptr(), o_shape, o_strides, dts, CUDA, dev),
                dt_softplus,
                stream(dev),
            )
            return out
    return _state_update_any(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, key)


def _state_update_any(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any,
    z: Any,
    dt_bias: Any,
    dt_softplus: Any,
    key: Any,
) -> Any:
    """The general path of `selective_state_update`: any framework, every check; records the
    plan of a torch signature (`key`, not None when every array is a torch tensor) it sends to
    the GPU."""
    hx = _HANDLERS.get(type(x)) or _resolve(x, "x")
    objs = (state, x, dt, A, B, C, D, z, dt_bias)
    hands, descs, nargs = _describe_all(objs, _SSU_ARGS, 6, hx, type(x))
    dx = descs[1]
    assert dx is not None
    check = _checks.state_update if key is not None else _checks.state_update_memo
    batch, nheads, dim, _, _ = check(*descs)  # type: ignore[arg-type]
    hs = hands[0]
    assert hs is not None
    if not hs.always_writable:
        _checks.writable("state", state, hs)
    dt_softplus = _flag("dt_softplus", dt_softplus)

    if dx[4] == CUDA and batch and nheads and dim:
        if dx[5] in _usable_devices():
            # --- the GPU, general path ------------------------------------------------------
            if key is not None:
                _checks.remember(
                    _SSU_PLANS,
                    key,
                    _plan(
                        hx,
                        dx,
                        descs[4][3],  # type: ignore[index]
                        descs[5][3],  # type: ignore[index]
                        (batch, nheads, dim) if len(dx[1]) == 3 else (batch, dim),
                        None,
                    ),
                )
            out = hx.empty(dx[1], dx[3], x, dx)
            _native.selective_state_update(  # type: ignore[union-attr]
                *nargs,
                hx.describe_new(out, dx[1], dx[3], dx) if hx.fast else out,
                dt_softplus,
                hx.stream(dx[5]),
            )
            return hx.finish(out) if hx.needs_finish else out
        _backend.on_fallback("selective_state_update", _backend.device_reason(dx[5]), depth=2)

    # CPU arrays, empty problems, or the fallback: the reference on host copies; the new
    # state is written back into the caller's array (a no-op where the host copy is a view).
    host = [None if o is None else h.to_host(o) for o, h in zip(objs, hands)]  # type: ignore[union-attr]
    y = reference.selective_state_update(*host, dt_softplus=dt_softplus)
    hs.copy_into(state, host[0])
    return hx.from_host(y, dx[3], x, dx)
