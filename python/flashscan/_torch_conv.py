"""The torch adapter of the causal conv1d (part of `flashscan.torch`, which imports it): the
`torch.library` custom ops `flashscan::causal_conv1d_fwd` / `causal_conv1d_bwd` with fake
implementations and an autograd formula, which `torch.compile(fullgraph=True)` traces, and a
lean `autograd.Function` over the same implementations for eager calls (the custom op's
dispatch costs more than the rest of a small call).

Where the work runs: CUDA tensors on a served device -> the CUDA kernels; CPU tensors and
float64 tensors (any device) -> the NumPy references in float64 (what gradcheck checks); CUDA
tensors the backend cannot serve -> the fallback policy, then the references.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from . import _backend, _checks, _routes, reference_conv
from . import conv as _conv
from ._frameworks import handler_of

__all__ = ["causal_conv1d_fn"]

_native = _backend.native
_F64 = torch.float64
_TORCH = handler_of(torch.empty(0), "tensor")


def _host(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else _TORCH.to_host(t)


def _from_host(a: np.ndarray, like: Tensor) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device=like.device, dtype=like.dtype)


def _absent(like: Tensor) -> Tensor:
    """The stand-in for an absent optional output (custom ops cannot return None)."""
    return like.new_empty((0,))


def _act(silu: bool) -> str | None:
    return "silu" if silu else None


def _channel_last(x: Tensor) -> bool:
    return x.dim() == 3 and x.shape[2] > 1 and x.stride(2) != 1


def _like_x(t: Tensor, x: Tensor) -> Tensor:
    """t (shaped like x) in x's layout and dtype, as the backward kernel reads it."""
    t = t.to(x.dtype)
    if _channel_last(x):
        return t if t.stride(1) == 1 else t.transpose(1, 2).contiguous().transpose(1, 2)
    return t if t.stride(2) == 1 else t.contiguous()


def _empty_like_x(x: Tensor) -> Tensor:
    b, d, n = x.shape
    return x.new_empty((b, n, d)).transpose(1, 2) if _channel_last(x) else x.new_empty((b, d, n))


def _on_gpu(x: Tensor) -> bool:
    if not x.is_cuda or x.dtype == _F64:
        return False
    dev = x.get_device()
    if dev in _backend.usable_devices():
        return True
    _backend.on_fallback("causal_conv1d_bwd", _backend.device_reason(dev), depth=3)
    return False


def _fwd_impl(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],  # noqa: UP045 - torch.library parses the annotation
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    return_final_states: bool,
    silu: bool,
) -> tuple[Tensor, Tensor]:
    """(out, final_states); final_states is an empty (0,) tensor unless asked for."""
    if x.dtype == _F64:
        y, fin = reference_conv.causal_conv1d_fn(
            _host(x),
            _host(weight),
            _host(bias),
            _host(initial_states),
            return_final_states=True,
            activation=_act(silu),
            seq_idx=_host(seq_idx),
        )
        return _from_host(y, x), (_from_host(fin, x) if return_final_states else _absent(x))
    r = _conv.conv_fwd_any(
        x, weight, bias, initial_states, return_final_states, None, _act(silu), seq_idx
    )
    if return_final_states:
        return r[0], r[1]
    return r, _absent(x)


_fwd = torch.library.custom_op("flashscan::causal_conv1d_fwd", _fwd_impl, mutates_args=())


@_fwd.register_fake
def _fwd_fake(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    return_final_states: bool,
    silu: bool,
) -> tuple[Tensor, Tensor]:
    fin = x.new_empty((x.shape[0], x.shape[1], weight.shape[1] - 1))
    return _empty_like_x(x), fin if return_final_states else _absent(x)


def _bwd_impl(
    dout: Tensor,
    dfinal_states: Optional[Tensor],  # noqa: UP045
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    silu: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias, dinitial_states), each in its input's dtype; an absent input's
    gradient is an empty (0,) tensor."""
    if _on_gpu(x) and x.shape[0] and x.shape[1] and x.shape[2]:
        dout = _like_x(dout, x)
        dfin = None if dfinal_states is None else dfinal_states.to(x.dtype)
        dx = _empty_like_x(x)
        dw = weight.new_empty(weight.shape)
        db = None if bias is None else bias.new_empty(bias.shape)
        dinit = None if initial_states is None else initial_states.new_empty(initial_states.shape)

        def d(t: Tensor | None, name: str) -> Any:
            return None if t is None else _TORCH.describe(t, name)

        _native.causal_conv1d_bwd(  # type: ignore[union-attr]
            d(x, "x"),
            d(weight, "weight"),
            d(bias, "bias"),
            d(initial_states, "initial_states"),
            d(seq_idx, "seq_idx"),
            d(dout, "dout"),
            d(dfin, "dfinal_states"),
            d(dx, "dx"),
            d(dw, "dweight"),
            d(db, "dbias"),
            d(dinit, "dinitial_states"),
            silu,
            _TORCH.stream(x.get_device()),
        )
        grads: tuple[Tensor | None, ...] = (dx, dw, db, dinit)
    else:
        host = reference_conv.causal_conv1d_bwd(
            _host(dout),
            _host(x),
            _host(weight),
            _host(bias),
            _host(initial_states),
            _host(dfinal_states),
            _act(silu),
            _host(seq_idx),
        )
        grads = tuple(
            None if g is None else _from_host(g, like)
            for g, like in zip(host, (x, weight, bias, initial_states))  # type: ignore[arg-type]
        )
    return tuple(_absent(x) if g is None else g for g in grads)  # type: ignore[return-value]


_bwd = torch.library.custom_op("flashscan::causal_conv1d_bwd", _bwd_impl, mutates_args=())


@_bwd.register_fake
def _bwd_fake(
    dout: Tensor,
    dfinal_states: Optional[Tensor],  # noqa: UP045
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],  # noqa: UP045
    initial_states: Optional[Tensor],  # noqa: UP045
    seq_idx: Optional[Tensor],  # noqa: UP045
    silu: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (
        _empty_like_x(x),
        weight.new_empty(weight.shape),
        _absent(x) if bias is None else bias.new_empty(bias.shape),
        _absent(x) if initial_states is None else initial_states.new_empty(initial_states.shape),
    )


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    x, weight, bias, initial_states, seq_idx, return_final_states, silu = inputs
    ctx.save_for_backward(x, weight, bias, initial_states, seq_idx)
    ctx.silu = silu
    ctx.final = return_final_states


def _grad(ctx: Any, dout: Tensor, dfinal: Tensor) -> tuple[Any, ...]:
    x, weight, bias, initial_states, seq_idx = ctx.saved_tensors
    dx, dw, db, dinit = torch.ops.flashscan.causal_conv1d_bwd(
        dout,
        dfinal if ctx.final else None,
        x,
        weight,
        bias,
        initial_states,
        seq_idx,
        ctx.silu,
    )
    return (
        dx,
        dw,
        None if bias is None else db,
        None if initial_states is None else dinit,
        None,
        None,
        None,
    )


_fwd.register_autograd(_grad, setup_context=_setup)


class _CausalConv1d(torch.autograd.Function):
    """The eager path: the same two implementations as the custom ops, without the
    `torch.library` dispatch around each (measured on the CPU harness,
    tools/bench_python_layer.py --training: most of an eager real-time step was that
    dispatch). torch.compile traces the custom ops instead (see `causal_conv1d_fn`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        initial_states: Tensor | None,
        seq_idx: Tensor | None,
        return_final_states: bool,
        silu: bool,
    ) -> Any:
        ctx.set_materialize_grads(False)
        out, fin = _fwd_impl(x, weight, bias, initial_states, seq_idx, return_final_states, silu)
        ctx.save_for_backward(x, weight, bias, initial_states, seq_idx)
        ctx.silu = silu
        ctx.final = return_final_states
        if not return_final_states:
            ctx.mark_non_differentiable(fin)
        return out, fin

    @staticmethod
    def backward(ctx: Any, dout: Tensor | None, dfinal: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        if dout is None and (dfinal is None or not ctx.final):
            return (None,) * 7
        x, weight, bias, initial_states, seq_idx = ctx.saved_tensors
        if dout is None:  # only the final states reach the loss
            dout = _empty_like_x(x).zero_()
        dx, dw, db, dinit = _bwd_impl(
            dout,
            dfinal if ctx.final else None,
            x,
            weight,
            bias,
            initial_states,
            seq_idx,
            ctx.silu,
        )
        need = ctx.needs_input_grad
        return (
            dx if need[0] else None,
            dw if need[1] else None,
            db if bias is not None and need[2] else None,
            dinit if initial_states is not None and need[3] else None,
            None,
            None,
            None,
        )


def causal_conv1d_fn(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    initial_states: Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: Tensor | None = None,
    activation: str | None = None,
    seq_idx: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """`flashscan.causal_conv1d_fn` as a differentiable torch op (same arguments).

    Gradients reach x, weight, bias and initial_states, also through the returned final
    states. float64 tensors run the NumPy references."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: flashscan.torch takes torch tensors, got {type(t).__name__}")
    silu = _checks.conv_activation(activation)
    return_final_states = _checks.flag("return_final_states", return_final_states)
    args = (x, weight, bias, initial_states, seq_idx, return_final_states, silu)
    if torch.compiler.is_compiling():
        out, fin = torch.ops.flashscan.causal_conv1d_fwd(*args)
    else:
        out, fin = _CausalConv1d.apply(*args)
    if not return_final_states:
        return out
    if final_states_out is not None:
        final_states_out.copy_(fin)
        return out, final_states_out
    return out, fin


_routes.register("causal_conv1d_fn", causal_conv1d_fn)
