"""Mamba-2's SSD chunked scan (`mamba_chunk_scan_combined`), on the CUDA backend or the NumPy
reference (`reference_ssd`).

Dispatch as in `scan`: checks (`_checks.ssd`), then CUDA arrays on a served device ->
`_native.ssd_fwd` on the caller's current stream; CPU arrays -> the reference; CUDA arrays the
backend cannot serve -> the fallback policy, then the reference on the host. A torch call that
needs gradients goes to the differentiable op `flashscan.torch` registers in `_routes`.
"""

from __future__ import annotations

import math
import os
from typing import Any

from . import _backend, _checks, _routes, reference_ssd
from ._backend import UnsupportedError
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

__all__ = ["mamba_chunk_scan_combined"]

_native = _backend.native
_NO_DEVICES: frozenset[int] = frozenset()

# The hot path, as in `scan`: a torch call whose signature (`_key`) was checked and served on the
# GPU before skips the checks. signature -> plan (see `_record`); bounded like the check memos;
# replaced whole, never mutated.
_PLANS: dict[Any, tuple[Any, ...]] = {}

_ARGS = (
    "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx", "cu_seqlens",
)  # fmt: skip

# float16 / bfloat16 x run the second forward path (cuda/ssd_fwd2.cu: C B^T once per group,
# cp.async + ldmatrix operands): the native call runs it when given the C B^T workspace. Its
# first H100 run (b51813a) passed the forward matrix and the sanitizers and took 1.25 ms against
# the first path's 7.75 ms (b8 L2048, 80 heads x 64, state 128). FLASHSCAN_SSD_FWD=1 keeps the
# first path (cuda/ssd.cu, which float32 always takes); read on every call (a dict lookup) so
# that tests and benchmarks can switch it within one process.
_FWD2_DTYPES = ("float16", "bfloat16")


def _fwd2(dtype_name: str) -> bool:
    """Whether this call takes the second forward path (see FLASHSCAN_SSD_FWD above)."""
    return dtype_name in _FWD2_DTYPES and os.environ.get("FLASHSCAN_SSD_FWD") != "1"


# The native server of planned torch signatures (`_native.SsdServer`, src/serve/:
# one native call, workspaces from the device's stream-ordered pool), made on the first hot
# call; False where this build has none. `_SERVE` is its `serve` once it has served a call.
_SERVER: Any = None
_SERVE: Any = None

# torch.compiler.is_compiling once a server exists (see `_backend.make_server`)
_is_compiling: Any = _backend.never


def _make_server() -> Any:
    """The server, made now; None (asked again next time) while `_native` is not the real
    module (tests swap in fakes)."""
    global _SERVER, _is_compiling
    server, compiling = _backend.make_server(_native, "SsdServer", grad=True)
    if server is not None:
        _SERVER = server
    if compiling is not None:
        _is_compiling = compiling
    return server


def mamba_chunk_scan_combined(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    chunk_size: int,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    initial_states: Any = None,
    seq_idx: Any = None,
    cu_seqlens: Any = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Any:
    """Mamba-2's SSD scan with mamba_ssm's names, shapes and math.

    x, z: (batch, seqlen, nheads, headdim); dt: (batch, seqlen, nheads); A, dt_bias: (nheads,);
    B, C: (batch, seqlen, ngroups, dstate), ngroups dividing nheads; D: (nheads,) or
    (nheads, headdim); initial_states: (batch, nheads, headdim, dstate); seq_idx: (batch,
    seqlen) int32/int64 (a change of id starts a new sequence from a zero state; the id before
    position 0 is 0, so initial_states belongs to id 0); cu_seqlens: (num_sequences + 1,)
    offsets, read only with return_varlen_states (batch 1). Float arrays in float16, bfloat16
    or float32; x and z share a dtype, B and C share one.

    Per (batch, head h, group g of h): dt' = clamp(softplus?(dt + dt_bias), *dt_limit);
    H_t = exp(dt'_t A) H_{t-1} + dt'_t x_t B_t^T; y_t = H_t C_t + D x_t;
    out = y * silu(z) when z is given. chunk_size is the block size of the computation and
    does not change the result (beyond rounding).

    Returns out (like x); with return_final_states also final_states (batch, nheads, headdim,
    dstate) float32; with return_varlen_states also varlen_states (num_sequences, nheads,
    headdim, dstate) float32, each sequence's last state; in mamba_ssm's order, in x's
    framework. (mamba_ssm returns the states in C's dtype; flashscan keeps float32.)
    """
    global _SERVE
    serve = _SERVE
    if serve is not None and not _is_compiling():
        # a planned signature in one native call (None: not one it serves)
        r = serve(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_limit, return_final_states, return_varlen_states, False,
        )  # fmt: skip
        if r is not None:
            return r
    key = _key(
        (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx),
        (chunk_size, dt_softplus, dt_limit, return_final_states, return_varlen_states),
    )
    if key is not None:
        plan = _PLANS.get(key)
        if plan is not None and plan[0] in (_backend._usable or _NO_DEVICES):
            tensors = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
            if not (any(t is not None and t.requires_grad for t in tensors) and grad_enabled()):
                server = _SERVER if _SERVER is not None else _make_server()
                if server:
                    # a checked signature, served natively from now on where it can be
                    r = server.serve(
                        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                        cu_seqlens, dt_softplus, dt_limit, return_final_states,
                        return_varlen_states, True,
                    )  # fmt: skip
                    if r is not None:
                        _SERVE = server.serve
                        return r
                out, final = _serve(plan, tensors)
                return out if final is None else (out, final)
    hx = _HANDLERS.get(type(x)) or _resolve(x, "x")
    objs = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    if needs_autograd(hx, objs):
        return _routes.differentiable("mamba_chunk_scan_combined")(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_limit, return_final_states, return_varlen_states,
        )  # fmt: skip
    out, final, varlen = ssd_any(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, dt_limit, return_final_states, return_varlen_states, key=key,
    )  # fmt: skip
    result = (
        (out,) + ((final,) if final is not None else ()) + ((varlen,) if varlen is not None else ())
    )
    return result[0] if len(result) == 1 else result


def _describe(objs: tuple[Any, ...], hx: Handler) -> tuple[list[Handler | None], list[Desc | None]]:
    hands: list[Handler | None] = []
    descs: list[Desc | None] = []
    for i, (o, name) in enumerate(zip(objs, _ARGS)):
        if o is None and i >= 5:
            hands.append(None)
            descs.append(None)
            continue
        h = hx if type(o) is type(objs[0]) else (_HANDLERS.get(type(o)) or _resolve(o, name))
        hands.append(h)
        descs.append(h.describe(o, name))
    return hands, descs


def ssd_any(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    chunk_size: Any,
    D: Any,
    z: Any,
    dt_bias: Any,
    initial_states: Any,
    seq_idx: Any,
    cu_seqlens: Any,
    dt_softplus: Any,
    dt_limit: Any,
    return_final_states: Any,
    return_varlen_states: Any,
    floats: tuple[str, ...] = _checks.FLOAT_DTYPES,
    key: Any = None,
    keep: list[Any] | None = None,
) -> tuple[Any, Any, Any]:
    """Every check, then the GPU or the host: (out, final_states or None, varlen_states or
    None) in x's framework. The torch adapter calls this with `floats` widened to float64.
    `key`: the torch signature of the call (`_key`), recorded with its plan when served on
    the GPU, or None. `keep`: a list that receives the forward's (states16, decay) when the
    GPU forward kept them for the backward (see `_gpu_forward`)."""
    hx = _HANDLERS.get(type(x)) or _resolve(x, "x")
    objs = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens)
    hands, descs = _describe(objs, hx)
    chunk_size = _checks.positive_int("chunk_size", chunk_size)
    dt_softplus = _checks.flag("dt_softplus", dt_softplus)
    limit = _checks.dt_limit(dt_limit)
    return_final_states = _checks.flag("return_final_states", return_final_states)
    return_varlen_states = _checks.flag("return_varlen_states", return_varlen_states)
    _checks.ssd(*descs, return_varlen_states, floats)  # type: ignore[arg-type]
    dx = descs[0]
    assert dx is not None
    if dx[4] == CUDA and dx[3] != "float64" and all(int(s) for s in dx[1]):
        if return_varlen_states and not _fwd2(dx[3]):
            raise UnsupportedError(
                "mamba_chunk_scan_combined: return_varlen_states on the GPU covers float16 / "
                "bfloat16 x on the second forward path (FLASHSCAN_SSD_FWD unset); float32 runs "
                "on CPU arrays"
            )
        if dx[5] in _backend.usable_devices():
            varlen = None
            if return_varlen_states:
                varlen = _varlen_offsets(hx, objs, hands, int(dx[1][1]))
            out, final, varlen_states = _gpu_forward(
                hx, objs, descs, chunk_size, dt_softplus, limit, return_final_states, keep, varlen
            )
            if return_varlen_states:  # (no plan: the hot path serves no varlen call)
                return out, final, varlen_states
            if key is not None and (descs[9] is None or descs[9][3] == "int32"):
                _checks.remember(
                    _PLANS,
                    key,
                    _record(hx, descs, chunk_size, dt_softplus, limit, return_final_states),
                )
            return out, final, None
        _backend.on_fallback("mamba_chunk_scan_combined", _backend.device_reason(dx[5]), depth=3)
    host = [None if o is None else h.to_host(o) for o, h in zip(objs, hands)]  # type: ignore[union-attr]
    if return_varlen_states:
        _checks.ssd_cu_seqlens_values(host[10], int(dx[1][1]))  # type: ignore[arg-type]
    res = reference_ssd.mamba_chunk_scan_combined(
        *host[:5], chunk_size, *host[5:11],  # type: ignore[misc]
        dt_softplus=dt_softplus, dt_limit=limit, return_final_states=True,
        return_varlen_states=return_varlen_states,
    )  # fmt: skip
    states = "float64" if dx[3] == "float64" else "float32"
    out = hx.from_host(res[0], dx[3], x, dx)
    final = hx.from_host(res[1], states, x, dx) if return_final_states else None
    varlen = hx.from_host(res[2], states, x, dx) if return_varlen_states else None
    return out, final, varlen


def _varlen_offsets(hx: Handler, objs: tuple[Any, ...], hands: list[Any], seqlen: int) -> Any:
    """cu_seqlens (int32, on the device) for the GPU's varlen states, after checking on the host
    (one synchronisation) that its offsets run from 0 to seqlen and that seq_idx (objs[9])
    changes exactly where a non-empty sequence starts: the kernel takes a sequence's carried
    state from the state passing, whose resets seq_idx places (mamba_ssm's contract, checked
    here rather than assumed). With initial_states, position 0 must belong to sequence 0."""
    import numpy as np

    cu_obj, seq_obj = objs[10], objs[9]
    cu = np.asarray(hands[10].to_host(cu_obj)).reshape(-1).astype(np.int64)
    _checks.ssd_cu_seqlens_values(cu, seqlen)
    starts = sorted({int(v) for v in cu[1:-1] if 0 < v < seqlen})
    seq = None if seq_obj is None else np.asarray(hands[9].to_host(seq_obj))[0]
    changes = [] if seq is None else (np.flatnonzero(seq[1:] != seq[:-1]) + 1).tolist()
    if changes != starts:
        raise ValueError(
            "return_varlen_states on the GPU: seq_idx must change exactly where cu_seqlens starts "
            f"a sequence (starts {starts[:8]}, seq_idx changes at {changes[:8]}); pass seq_idx "
            "with the sequence index of every position, as mamba_ssm expects"
        )
    if objs[8] is not None and (int(cu[1]) == 0 or (seq is not None and int(seq[0]) != 0)):
        raise ValueError(
            "return_varlen_states with initial_states: the initial state starts sequence 0, so "
            "sequence 0 must not be empty and seq_idx must start at 0"
        )
    return cu_obj if hands[10].describe(cu_obj, "cu_seqlens")[3] == "int32" else _as_int32(cu_obj)


def _as_int32(seq_idx: Any) -> Any:
    """seq_idx as int32 (the kernels' index type): torch `.int()`, else `.astype`."""
    to_int = getattr(seq_idx, "int", None)
    return to_int() if callable(to_int) else seq_idx.astype("int32")


def _gpu_forward(
    hx: Handler,
    objs: tuple[Any, ...],
    descs: list[Desc | None],
    chunk_size: int,
    dt_softplus: bool,
    limit: tuple[float, float],
    return_final_states: bool,
    keep: list[Any] | None = None,
    cu_seqlens: Any = None,
) -> tuple[Any, Any, Any]:
    """`_native.ssd_fwd` on the caller's stream: allocates out, the final states (when asked)
    and the fp32 workspaces (chunk states, chunk decays) like x. (out, final_states or None,
    varlen_states or None). `keep` (a list): where the call carries states on the second path
    (`_keeps`), the state passing also writes the 16-bit H_c to a tensor of its own, and (that
    tensor, the chunk decays) are appended to `keep` for the backward. `cu_seqlens` (int32, on
    the device, checked by `_varlen_offsets`): the states after each sequence, (nseq, nheads,
    headdim, dstate) float32, from ssd2_varlen_states."""
    x = objs[0]
    dx = descs[0]
    assert dx is not None
    batch, seqlen, nheads, headdim = (int(v) for v in dx[1])
    dstate = int(descs[3][1][3])  # type: ignore[index]
    nchunks = -(-seqlen // chunk_size)
    objs = list(objs)
    dseq = descs[9]
    if dseq is not None and dseq[3] != "int32":
        objs[9] = _as_int32(objs[9])
        descs = list(descs)
        descs[9] = hx.describe(objs[9], "seq_idx")
    fast = hx.fast
    nargs = [d if fast else o for d, o in zip(descs[:10], objs[:10])]

    def new(shape: tuple[int, ...], dtype: str) -> tuple[Any, Any]:
        a = hx.empty(shape, dtype, x, dx)
        return a, (hx.describe_new(a, shape, dtype, dx) if fast else a)

    st_shape = (batch, nheads, headdim, dstate)
    out, n_out = new(tuple(dx[1]), dx[3])
    final, n_final = new(st_shape, "float32") if return_final_states else (None, None)
    # the workspaces stay referenced until the launch: a dropped one goes back to the framework's
    # allocator, and the next workspace may be carved from the same bytes
    states, n_states = new((batch, nchunks, nheads, headdim, dstate), "float32")
    decay, n_decay = new((batch, nheads, nchunks), "float32")
    cb = n_cb = h16 = n_h16 = None
    if _fwd2(dx[3]):
        ngroups = int(descs[3][1][2])  # type: ignore[index]
        cb, n_cb = new((batch, nchunks, ngroups, chunk_size, chunk_size), "float32")
        if keep is not None and _keeps(nchunks, objs[8] is not None, return_final_states):
            h16, n_h16 = new((batch, nchunks, nheads, headdim, dstate), dx[3])
    varlen = n_varlen = n_cu = None
    if cu_seqlens is not None:
        nseq = int(hx.describe(cu_seqlens, "cu_seqlens")[1][0]) - 1
        varlen, n_varlen = new((nseq, nheads, headdim, dstate), "float32")
        n_cu = hx.describe(cu_seqlens, "cu_seqlens") if fast else cu_seqlens
    _native.ssd_fwd(  # type: ignore[union-attr]
        *nargs, n_out, n_final, n_states, n_decay, chunk_size, dt_softplus, limit[0], limit[1],
        hx.stream(dx[5]), n_cb, n_h16, n_cu, n_varlen,
    )  # fmt: skip
    if h16 is not None:
        keep.append((h16, decay))  # type: ignore[union-attr]
    del states, decay, cb, h16  # released after the launch (stream-ordered reuse from here on)
    if hx.needs_finish:
        out = hx.finish(out)
        if final is not None:
            final = hx.finish(final)
        if varlen is not None:
            varlen = hx.finish(varlen)
    return out, final, varlen


def _keeps(nchunks: int, has_init: bool, has_final: bool) -> bool:
    """Whether a second-path forward asked to keep its states has any: it runs the state
    passing (more than one chunk, or initial or final states), else the backward has no state
    term either."""
    return nchunks > 1 or has_init or has_final


def _key(tensors: tuple[Any, ...], options: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The signature of a call whose arrays are all torch tensors (None for an absent optional,
    cu_seqlens absent): each tensor's (shape, strides, dtype, device), then the options as
    given (hashable ones only). None otherwise: the general path serves such calls."""
    if not all(t is None or type(t) in TORCH_TYPES for t in tensors):
        return None
    # options of plain types only (an unhashable or odd one: the general path says why); a type
    # test, not hash(): torch.compile (2.11) cannot trace hash() of a tuple
    for o in options:
        if not (
            o is None
            or type(o) in _PLAIN
            or (type(o) is tuple and all(type(v) in _PLAIN for v in o))
        ):
            return None
    try:
        sig = tuple(
            None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors
        )
    except Exception:  # no strides (sparse...): the general path says why
        return None
    return sig + options


_PLAIN = (int, float, bool, str)


def _record(
    hx: Handler,
    descs: list[Desc | None],
    chunk: int,
    softplus: bool,
    limit: tuple[float, float],
    return_final: bool,
) -> tuple[Any, ...]:
    """What the hot path needs for a checked signature served on the GPU: the device, each
    array's dtype name (None when absent), the shapes of out, final states (or None) and the
    workspaces (the C B^T one of the second path last), the options as the native call takes
    them, and the stream lookup."""
    dx = descs[0]
    assert dx is not None
    batch, seqlen, nheads, headdim = (int(v) for v in dx[1])
    ngroups, dstate = (int(v) for v in descs[3][1][2:])  # type: ignore[index]
    nchunks = -(-seqlen // chunk)
    return (
        dx[5],
        tuple(None if d is None else d[3] for d in descs[:10]),
        tuple(dx[1]),
        (batch, nheads, headdim, dstate) if return_final else None,
        (batch, nchunks, nheads, headdim, dstate),
        (batch, nheads, nchunks),
        chunk,
        softplus,
        limit,
        hx.current_stream,  # type: ignore[attr-defined]
        hx.float32,  # type: ignore[attr-defined]
        (batch, nchunks, ngroups, chunk, chunk),
    )


def _serve(
    plan: tuple[Any, ...], tensors: tuple[Any, ...], keep: list[Any] | None = None
) -> tuple[Any, Any]:
    """The hot path: allocate, describe from the plan, one `_native.ssd_fwd` call.
    (out, final states or None); final states only when the key asked for them. `keep`: as
    `_gpu_forward`'s."""
    (
        dev,
        names,
        o_shape,
        f_shape,
        s_shape,
        d_shape,
        chunk,
        softplus,
        limit,
        stream,
        f32,
        cb_shape,
    ) = plan
    x = tensors[0]
    descs = [
        None if t is None else (t.data_ptr(), t.shape, t.stride(), n, CUDA, dev)
        for t, n in zip(tensors, names)
    ]

    def new(shape: tuple[int, ...], dtype: Any, name: str) -> tuple[Any, Desc]:
        a = x.new_empty(shape, dtype=dtype)
        return a, (a.data_ptr(), shape, a.stride(), name, CUDA, dev)

    out, d_out = new(o_shape, x.dtype, names[0])
    final = d_final = None
    if f_shape is not None:
        final, d_final = new(f_shape, f32, "float32")
    # workspaces referenced until the launch (a dropped one may be reused by the next allocation)
    states, d_states = new(s_shape, f32, "float32")
    decay, d_decay = new(d_shape, f32, "float32")
    cb, d_cb = new(cb_shape, f32, "float32") if _fwd2(names[0]) else (None, None)
    h16 = d_h16 = None
    carried = _keeps(s_shape[1], tensors[8] is not None, f_shape is not None)
    if cb is not None and keep is not None and carried:
        h16, d_h16 = new(s_shape, x.dtype, names[0])
    _native.ssd_fwd(  # type: ignore[union-attr]
        *descs, d_out, d_final, d_states, d_decay, chunk, softplus, limit[0], limit[1], stream(dev),
        d_cb, d_h16, None, None,  # no varlen states: the general path's arguments, one for one
    )  # fmt: skip
    if h16 is not None:
        keep.append((h16, decay))  # type: ignore[union-attr]
    del states, decay, cb, h16
    return out, final
