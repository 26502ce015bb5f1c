"""The causal depthwise conv1d of every Mamba block (`causal_conv1d_fn`) and its decode step
(`causal_conv1d_update`), with causal-conv1d's names and semantics, on the CUDA backend or the
NumPy reference (`reference_conv`).

Dispatch as in `scan`: checks, then CUDA arrays on a served device -> `_native` on the caller's
current stream; CPU arrays -> the reference; CUDA arrays the backend cannot serve -> the
fallback policy, then the reference on the host. Torch calls that need gradients go to the
differentiable op that `flashscan.torch` registers in `_routes`.
"""

from __future__ import annotations

from typing import Any

from . import _backend, _checks, _routes, reference_conv
from ._frameworks import _HANDLERS, CUDA, TORCH_TYPES, Handler, _resolve, needs_autograd
from .scan import _describe_all

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]

_native = _backend.native

_FN_ARGS = ("x", "weight", "bias", "initial_states", "seq_idx")
_UPDATE_ARGS = ("x", "conv_state", "weight", "bias", "cache_seqlens")


def causal_conv1d_fn(
    x: Any,
    weight: Any,
    bias: Any = None,
    initial_states: Any = None,
    return_final_states: bool = False,
    final_states_out: Any = None,
    activation: str | None = None,
    seq_idx: Any = None,
) -> Any | tuple[Any, Any]:
    """Causal depthwise conv1d, causal-conv1d's `causal_conv1d_fn`.

    x: (batch, dim, seqlen) in float16, bfloat16 or float32, contiguous along seqlen or along
    dim (the channel-last layout: ``x.transpose(1, 2)`` of a contiguous (batch, seqlen, dim));
    weight: (dim, width), width 2..4, in x's dtype or float32; bias: (dim,) like weight;
    initial_states: (batch, dim, width - 1) in x's dtype, the inputs before x (streaming);
    seq_idx: (batch, seqlen) int32, the sequence each position belongs to (packed
    sequences: no input crosses into another sequence; negative ids are padding);
    activation: None, "silu" or "swish".

    out[t] = act(bias + sum_k weight[:, k] * x[t - (width - 1) + k]), fp32 accumulation.
    Returns out (like x, in x's dtype and layout), or (out, final_states) with
    return_final_states (the last width - 1 inputs, (batch, dim, width - 1); written into
    final_states_out when given).
    """
    hx = _frameworks_handler(x, "x")
    if needs_autograd(hx, (x, weight, bias, initial_states)):
        return _routes.differentiable("causal_conv1d_fn")(
            x,
            weight,
            bias,
            initial_states,
            return_final_states,
            final_states_out,
            activation,
            seq_idx,
        )
    return conv_fwd_any(
        x, weight, bias, initial_states, return_final_states, final_states_out, activation, seq_idx
    )


def _frameworks_handler(x: Any, arg: str) -> Handler:
    return _HANDLERS.get(type(x)) or _resolve(x, arg)


def _like_layout(h: Handler, x: Any, dx: Any, layout: str) -> Any:
    """A new array shaped like x (batch, dim, seqlen) in x's dtype and layout."""
    batch, dim, seqlen = dx[1]
    if layout == "cl" and not h.needs_finish:
        return h.empty((batch, seqlen, dim), dx[3], x, dx).swapaxes(1, 2)
    return h.empty((batch, dim, seqlen), dx[3], x, dx)


def conv_fwd_any(
    x: Any,
    weight: Any,
    bias: Any,
    initial_states: Any,
    return_final_states: Any,
    final_states_out: Any,
    activation: Any,
    seq_idx: Any,
) -> Any | tuple[Any, Any]:
    """The work of `causal_conv1d_fn` without the autograd routing (the torch adapter's op
    calls this): any framework, every check, GPU or reference."""
    hx = _frameworks_handler(x, "x")
    objs = (x, weight, bias, initial_states, seq_idx)
    hands, descs, nargs = _describe_all(objs, _FN_ARGS, 2, hx, type(x))
    dx = descs[0]
    assert dx is not None
    silu = _checks.conv_activation(activation)
    return_final_states = _checks.flag("return_final_states", return_final_states)
    batch, dim, seqlen, width = _checks.causal_conv1d(
        dx,
        descs[1],  # type: ignore[arg-type]
        descs[2],
        descs[3],
        descs[4],
        return_final_states,
    )
    fshape = (batch, dim, width - 1)
    fdesc = None
    if return_final_states and final_states_out is not None:
        hf = _frameworks_handler(final_states_out, "final_states_out")
        fdesc = hf.describe(final_states_out, "final_states_out")
        _checks.out_like(
            "final_states_out",
            final_states_out,
            hf,
            fdesc,
            fshape,
            dx[3],
            "x",
            dx,
            "(batch, dim, width - 1) in x's dtype",
        )

    if dx[4] == CUDA and batch and dim and seqlen:
        if dx[5] in _backend.usable_devices():
            layout = _checks.conv_layout("x", dx)
            out = _like_layout(hx, x, dx, layout)
            fin = None
            if return_final_states:
                fin = (
                    final_states_out
                    if final_states_out is not None
                    else hx.empty(fshape, dx[3], x, dx)
                )
            fast = hx.fast
            _native.causal_conv1d_fwd(  # type: ignore[union-attr]
                *nargs,
                hx.describe(out, "out") if fast else out,
                None if fin is None else (hx.describe(fin, "final_states_out") if fast else fin),
                silu,
                hx.stream(dx[5]),
            )
            if hx.needs_finish:
                out = hx.finish(out)
                if fin is not None and final_states_out is None:
                    fin = hx.finish(fin)
            return (out, fin) if return_final_states else out
        _backend.on_fallback("causal_conv1d_fn", _backend.device_reason(dx[5]), depth=2)

    # CPU arrays, empty problems, or the fallback: the reference on host copies.
    host = [None if o is None else h.to_host(o) for o, h in zip(objs, hands)]  # type: ignore[union-attr]
    y, final = reference_conv.causal_conv1d_fn(
        host[0],
        host[1],
        host[2],
        host[3],
        return_final_states=True,
        activation="silu" if silu else None,
        seq_idx=host[4],
    )
    out = hx.from_host(y, dx[3], x, dx)
    if not return_final_states:
        return out
    if final_states_out is not None:
        _frameworks_handler(final_states_out, "final_states_out").copy_into(final_states_out, final)
        return out, final_states_out
    return out, hx.from_host(final, dx[3], x, dx)


# The native server of checked torch signatures of `causal_conv1d_update`
# (`_native.ConvUpdateServer`, src/serve/: one native call a decode step), made on
# the first GPU call; False where this build has none. `_UPDATE_SERVE` is its `serve` once it
# has served a call.
_UPDATE_SERVER: Any = None
_UPDATE_SERVE: Any = None

# torch.compiler.is_compiling once a server exists (see `_backend.make_server`)
_is_compiling: Any = _backend.never


def _make_update_server() -> Any:
    """The server, made now; None (asked again next time) while `_native` is not the real
    module (tests swap in fakes)."""
    global _UPDATE_SERVER, _is_compiling
    server, compiling = _backend.make_server(_native, "ConvUpdateServer", grad=False)
    if server is not None:
        _UPDATE_SERVER = server
    if compiling is not None:
        _is_compiling = compiling
    return server


def causal_conv1d_update(
    x: Any,
    conv_state: Any,
    weight: Any,
    bias: Any = None,
    activation: str | None = None,
    cache_seqlens: Any = None,
) -> Any:
    """One decode step of the causal conv1d, causal-conv1d's `causal_conv1d_update`.

    x: (batch, dim) or (batch, dim, seqlen) new inputs in float16, bfloat16 or float32;
    conv_state: (batch, dim, state_len) in x's dtype, state_len >= width - 1, updated IN PLACE;
    weight (dim, width) in x's dtype or float32, width 2..4; bias (dim,) like weight;
    cache_seqlens: (batch,) int32, or None. Without it the inputs before x are the state's
    last width - 1 and the state becomes the last state_len of [state | x]; with it the state
    is a ring buffer whose next slot is cache_seqlens[b] % state_len (x is written from there,
    the inputs before x are the width - 1 slots before it). Returns out (like x).
    """
    global _UPDATE_SERVE
    serve = _UPDATE_SERVE
    if serve is not None and not _is_compiling():
        # a planned signature in one native call (None: not one it serves)
        r = serve(x, conv_state, weight, bias, cache_seqlens, activation, False)
        if r is not None:
            return r
    hx = _frameworks_handler(x, "x")
    objs = (x, conv_state, weight, bias, cache_seqlens)
    hands, descs, nargs = _describe_all(objs, _UPDATE_ARGS, 3, hx, type(x))
    dx = descs[0]
    assert dx is not None
    batch, dim, seqlen, _, _ = _checks.causal_conv1d_update(
        dx,
        descs[1],  # type: ignore[arg-type]
        descs[2],  # type: ignore[arg-type]
        descs[3],
        descs[4],
    )
    hs = hands[1]
    assert hs is not None
    if not hs.always_writable:
        _checks.writable("conv_state", conv_state, hs)
    silu = _checks.conv_activation(activation)

    if dx[4] == CUDA and batch and dim and seqlen:
        if dx[5] in _backend.usable_devices():
            if all(o is None or type(o) in TORCH_TYPES for o in objs):
                server = _UPDATE_SERVER if _UPDATE_SERVER is not None else _make_update_server()
                if server:
                    # a checked call: its signature is served natively from now on
                    r = server.serve(x, conv_state, weight, bias, cache_seqlens, activation, True)
                    if r is not None:
                        _UPDATE_SERVE = server.serve
                        return r
            out = hx.empty(tuple(dx[1]), dx[3], x, dx)
            _native.causal_conv1d_update(  # type: ignore[union-attr]
                *nargs,
                hx.describe(out, "out") if hx.fast else out,
                silu,
                hx.stream(dx[5]),
            )
            return hx.finish(out) if hx.needs_finish else out
        _backend.on_fallback("causal_conv1d_update", _backend.device_reason(dx[5]), depth=2)

    host = [None if o is None else h.to_host(o) for o, h in zip(objs, hands)]  # type: ignore[union-attr]
    y, new_state = reference_conv.causal_conv1d_update(
        host[0], host[1], host[2], host[3], "silu" if silu else None, host[4]
    )
    hs.copy_into(conv_state, new_state)
    return hx.from_host(y, dx[3], x, dx)
