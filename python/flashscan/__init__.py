"""flashscan: FlashAttention and Mamba selective-scan kernels, NVRTC-compiled at run time for the
GPU at hand, fed zero-copy through DLPack, with a NumPy reference where no usable GPU exists.

    import flashscan
    flashscan.available()        # True when the CUDA backend can run kernels here
    flashscan.info()             # backend, reason, devices, driver/NVRTC versions, cache dir
    out = flashscan.flash_attn_func(q, k, v, causal=True)
    out = flashscan.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens)
    out = flashscan.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    y = flashscan.selective_scan_fn(u, delta, A, B, C, D, z, delta_softplus=True)
    x = flashscan.causal_conv1d_fn(x, weight, bias, activation="silu")
    y = flashscan.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256, D=D, z=z)

Arrays of torch, cupy, jax or numpy (or anything speaking DLPack) go in; results come back in
the caller's framework, on its device. `import flashscan` never fails for lack of a GPU,
driver or NVRTC: `available()` is then False and `info()["reason"]` says why.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from typing import Any

from . import (
    _routes,
    reference,
    reference_bwd,
    reference_conv,
    reference_kvcache,
    reference_ssd,
    reference_varlen,
)
from ._backend import (
    CompileError,
    CudaError,
    FallbackWarning,
    FlashscanError,
    UnsupportedError,
)
from ._backend import native as _native
from ._backend import status as _status
from .attention import flash_attn_func
from .conv import causal_conv1d_fn, causal_conv1d_update
from .kvcache import flash_attn_with_kvcache
from .scan import selective_scan_fn, selective_state_update
from .ssd import mamba_chunk_scan_combined
from .varlen import flash_attn_varlen_func


def _load_torch_ops() -> None:
    """Import the torch adapter, which registers its differentiable ops in `_routes`: the core
    ops route a grad-requiring torch call there even when the caller never imported it."""
    from . import torch  # noqa: F401


_routes.add_loader(_load_torch_ops)
if "torch" in sys.modules:
    # torch is here already: load the adapter now (~20 ms) rather than on the first
    # grad-requiring call, which may be one torch.compile is tracing (dynamo does not run an
    # import inside a traced frame, so the op would be missing from the graph).
    _load_torch_ops()

__all__ = [
    "CompileError",
    "CudaError",
    "FallbackWarning",
    "FlashscanError",
    "UnsupportedError",
    "__version__",
    "available",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "info",
    "mamba_chunk_scan_combined",
    "reference",
    "reference_bwd",
    "reference_conv",
    "reference_kvcache",
    "reference_ssd",
    "reference_varlen",
    "selective_scan_fn",
    "selective_state_update",
]


def _version() -> str:
    if _native is not None:
        try:
            return str(_native.version())
        except Exception:  # pragma: no cover - a broken native build
            pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("flashscan")
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    return "0.0.0+unknown"


__version__: str = _version()


def available() -> bool:
    """True when the CUDA backend is usable: the native module loaded, a CUDA driver and NVRTC
    were found, and at least one GPU of compute capability 8.0 or newer is present.
    The first call initialises the driver (lazily, once per process); it never raises."""
    st = _status()
    return bool(st["available"]) and any(d.get("supported") for d in st["devices"])


def info() -> dict[str, Any]:
    """What flashscan sees on this machine, as a plain dict:

    backend ("cuda" or "numpy"), available, reason (why the CUDA backend is unusable, or None),
    version, devices ([{index, name, compute_capability, arch, supported, sm_count}]),
    driver_version, driver_path, nvrtc_version, nvrtc_path, cache_dir, fallback_policy,
    native (whether the native module loaded), python, platform, numpy, frameworks
    ({torch, cupy, jax: installed?}, found without importing them)."""
    st = _status()
    ok = available()
    reason = st.get("reason")
    if not ok and not reason:
        reason = "no CUDA device of compute capability 8.0 or newer"
    frameworks = {}
    for name in ("torch", "cupy", "jax"):
        try:
            frameworks[name] = name in sys.modules or importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # pragma: no cover
            frameworks[name] = False
    import numpy

    return {
        "backend": "cuda" if ok else "numpy",
        "available": ok,
        "reason": None if ok else reason,
        "version": __version__,
        "native": _native is not None,
        "devices": [dict(d) for d in st.get("devices", [])],
        "driver_version": st.get("driver_version"),
        "driver_path": st.get("driver_path"),
        "nvrtc_version": st.get("nvrtc_version"),
        "nvrtc_path": st.get("nvrtc_path"),
        "cache_dir": st.get("cache_dir"),
        "fallback_policy": os.environ.get("FLASHSCAN_FALLBACK", "warn"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "frameworks": frameworks,
    }
