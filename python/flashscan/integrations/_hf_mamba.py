"""transformers' Mamba models on flashscan's scan kernels.

Where transformers takes its kernels (checked with 5.23): each Mamba modeling module
(`transformers.models.mamba.modeling_mamba`, `...mamba2.modeling_mamba2`) defines its kernel
entry points as module-level functions (`mamba_selective_scan`, `mamba_selective_state_update`,
`causal_conv1d_fn`, ...), each wrapped by `use_kernel_func_from_hub_with_fallback`: at import
it binds mamba_ssm's / causal_conv1d's function when that package imports, else the module's
own torch code. The mixers' `forward` calls those module globals on every call, on any device.
So the one supported hook is to rebind those globals: `install(module_name)` swaps in
flashscan adapters (argument conversion, then the flashscan op) and keeps the originals, which
`uninstall` puts back. It acts on the module, so on every model of that class in the process,
as installing mamba_ssm would.

Each entry of `KERNELS` names a global and the factory of its adapter; a factory returns None
when this flashscan lacks the op (the global then keeps transformers' torch code): Mamba-2's
SSD chunk scan and the causal conv1d pair join by adding a factory each once flashscan has
`mamba_chunk_scan_combined` / `causal_conv1d_fn` / `causal_conv1d_update`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import torch
from torch import Tensor

import flashscan

__all__ = ["KERNELS", "install", "installed", "uninstall"]

_F32 = torch.float32


def _f32(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.to(_F32).contiguous()


def _no_packing(name: str, kwargs: dict[str, Any]) -> None:
    if kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None:
        raise flashscan.UnsupportedError(
            f"{name}: flashscan's scan does not keep packed sequences apart (cu_seqlens / "
            "seq_idx); pad the batch instead"
        )


def _selective_scan() -> Callable[..., Any]:
    """mamba_ssm's `selective_scan_fn` contract, as modeling_mamba calls it."""

    def selective_scan(
        hidden_states: Tensor,
        dt: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor | None = None,
        z: Tensor | None = None,
        delta_bias: Tensor | None = None,
        delta_softplus: bool = False,
        return_last_state: bool = False,
        **kwargs: Any,
    ) -> Any:
        _no_packing("selective_scan_fn", kwargs)
        u = hidden_states.contiguous()
        # B, C, z arrive as strided views of the projections; the kernel wants seqlen contiguous
        return flashscan.selective_scan_fn(
            u,
            dt.to(u.dtype).contiguous(),
            _f32(A),
            B.contiguous(),
            C.contiguous(),
            D=_f32(D),
            z=None if z is None else z.to(u.dtype).contiguous(),
            delta_bias=_f32(delta_bias),
            delta_softplus=bool(delta_softplus),
            return_last_state=bool(return_last_state),
        )

    return selective_scan


def _selective_state_update() -> Callable[..., Any]:
    """mamba_ssm's `selective_state_update` contract (Mamba-1 (batch, dim, dstate) and
    Mamba-2 (batch, nheads, headdim, dstate) states). flashscan keeps the state in float32: a
    cache in another dtype is updated through a float32 copy."""

    def selective_state_update(
        state: Tensor,
        hidden_states: Tensor,
        dt: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor | None = None,
        dt_bias: Tensor | None = None,
        dt_softplus: bool = False,
        z: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        x = hidden_states.contiguous()
        work = state if state.dtype == _F32 and state.is_contiguous() else state.to(_F32)
        work = work.contiguous()
        out = flashscan.selective_state_update(
            work,
            x,
            dt.to(x.dtype).contiguous(),
            _f32(A),
            B.contiguous(),
            C.contiguous(),
            D=_f32(D),
            z=None if z is None else z.to(x.dtype).contiguous(),
            dt_bias=_f32(dt_bias),
            dt_softplus=bool(dt_softplus),
        )
        if work is not state:
            state.copy_(work)
        return out

    return selective_state_update


def _flashscan_op(name: str) -> Callable[[], Callable[..., Any] | None]:
    """A factory for an op flashscan may not have yet: flashscan's function of the same
    name and contract (causal-conv1d's / mamba_ssm's) when it exists, else None
    (transformers' torch code stays). The mixers pass their forward's extra keyword
    arguments along; as transformers' own wrapper does, only those the op takes reach it."""

    def factory() -> Callable[..., Any] | None:
        op = getattr(flashscan, name, None)
        if op is None:
            return None
        params = inspect.signature(op).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return op

        def call(*args: Any, **kwargs: Any) -> Any:
            return op(*args, **{k: v for k, v in kwargs.items() if k in params})

        call.__name__ = call.__qualname__ = name
        return call

    return factory


# modeling module -> {module global: factory of its flashscan adapter}
KERNELS: dict[str, dict[str, Callable[[], Callable[..., Any] | None]]] = {
    "transformers.models.mamba.modeling_mamba": {
        "mamba_selective_scan": _selective_scan,
        "mamba_selective_state_update": _selective_state_update,
        # causal-conv1d's contract; flashscan's own arrive with the conv1d issue
        "causal_conv1d_fn": _flashscan_op("causal_conv1d_fn"),
        "causal_conv1d_update": _flashscan_op("causal_conv1d_update"),
        # mamba_inner_fn (training without a cache): its torch stand-in returns None and the
        # mixer goes on through the functions above, so the scan is still ours
    },
    "transformers.models.mamba2.modeling_mamba2": {
        "mamba2_selective_state_update": _selective_state_update,
        # not yet: flashscan's SSD (forward and backward) has CUDA kernels for chunk sizes
        # 64/128/256 only, where transformers' torch path takes any chunk size
        "mamba2_chunk_scan": lambda: None,
        "causal_conv1d_fn": _flashscan_op("causal_conv1d_fn"),
        "causal_conv1d_update": _flashscan_op("causal_conv1d_update"),
    },
}

# modeling module -> {global: transformers' original}, for the globals we rebound
_ORIGINALS: dict[str, dict[str, Any]] = {}


def install(module_name: str) -> dict[str, bool]:
    """Rebind the kernel globals of one modeling module to flashscan's adapters; returns
    {global: True when flashscan serves it, False when transformers' code stays}.
    Idempotent."""
    module = importlib.import_module(module_name)
    saved = _ORIGINALS.setdefault(module_name, {})
    served = {}
    for name, factory in KERNELS[module_name].items():
        if not hasattr(module, name):  # another transformers version: leave it be
            served[name] = False
            continue
        if name in saved:
            served[name] = True
            continue
        adapter = factory()
        served[name] = adapter is not None
        if adapter is not None:
            saved[name] = getattr(module, name)
            setattr(module, name, adapter)
    return served


def uninstall(module_name: str) -> None:
    """Put transformers' own functions back into the modeling module."""
    module = importlib.import_module(module_name)
    for name, original in _ORIGINALS.pop(module_name, {}).items():
        setattr(module, name, original)


def installed(module_name: str) -> dict[str, bool]:
    """Which globals of the module flashscan serves now."""
    saved = _ORIGINALS.get(module_name, {})
    return {name: name in saved for name in KERNELS[module_name]}
