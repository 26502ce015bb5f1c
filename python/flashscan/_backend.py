"""The CUDA backend as the Python layer sees it: the native module (or why it is missing),
its cached status, the exception family, and the fallback policy.

Importing this module never fails: a missing or broken `flashscan._native` leaves `native`
as None and `IMPORT_ERROR` saying why; the driver and NVRTC are only touched by the first
`status()` call (the native `backend_status()` initialises them lazily).

Fallback policy (`FLASHSCAN_FALLBACK`, read once, on the first fallback):
- `warn` (default): GPU arrays go to the host, through the NumPy reference and back, with
  one `FallbackWarning` per process saying why;
- `silent`: the same, with no warning;
- `error`: raise `FlashscanError` instead.
CPU arrays always use the NumPy reference: that is not a fallback.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Any

__all__ = [
    "IMPORT_ERROR",
    "CompileError",
    "CudaError",
    "FallbackWarning",
    "FlashscanError",
    "UnsupportedError",
    "default_cache_dir",
    "device_reason",
    "fallback_policy",
    "native",
    "on_fallback",
    "status",
    "usable_devices",
]

native: ModuleType | None
IMPORT_ERROR: str | None
try:
    native = importlib.import_module(__name__.rsplit(".", 1)[0] + "._native")

    IMPORT_ERROR = None
except (KeyboardInterrupt, SystemExit):
    raise
except BaseException as _exc:  # ImportError, OSError from a broken build, a PyO3 panic...
    native = None
    IMPORT_ERROR = (
        f"the native module flashscan._native could not be imported ({type(_exc).__name__}: {_exc})"
    )
    del _exc


if native is not None:
    FlashscanError = native.FlashscanError
    UnsupportedError = native.UnsupportedError
    CompileError = native.CompileError
    CudaError = native.CudaError
else:

    class FlashscanError(Exception):  # type: ignore[no-redef]
        """Base class of every flashscan error."""

    class UnsupportedError(FlashscanError):  # type: ignore[no-redef]
        """A valid request this build or GPU cannot serve (head dim > 256, GPU below sm_80...)."""

    class CompileError(FlashscanError):  # type: ignore[no-redef]
        """NVRTC rejected a kernel; `args[1]` (and the message) holds the NVRTC log."""

    class CudaError(FlashscanError):  # type: ignore[no-redef]
        """A CUDA driver call failed (message names the call and the CUresult)."""

    for _cls in (FlashscanError, UnsupportedError, CompileError, CudaError):
        _cls.__module__ = "flashscan"


class FallbackWarning(RuntimeWarning):
    """GPU arrays were computed on the host by the NumPy reference (CUDA backend unusable)."""


FallbackWarning.__module__ = "flashscan"


def default_cache_dir() -> str:
    """FLASHSCAN_CACHE_DIR, else ~/.cache/flashscan (what the native runtime uses)."""
    env = os.environ.get("FLASHSCAN_CACHE_DIR")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "flashscan")


# ---------------------------------------------------------------------------------------------
# Backend status (cached: the first call initialises the driver and NVRTC)
# ---------------------------------------------------------------------------------------------

_lock = threading.Lock()
_status: dict[str, Any] | None = None
_usable: frozenset[int] | None = None


def _unavailable(reason: str) -> dict[str, Any]:
    return {
        "available": False,
        "reason": reason,
        "driver_version": None,
        "driver_path": None,
        "nvrtc_version": None,
        "nvrtc_path": None,
        "devices": [],
        "cache_dir": default_cache_dir(),
    }


def status() -> dict[str, Any]:
    """The native `backend_status()`, computed once per process (a copy is not made: do not
    mutate). Never raises."""
    global _status, _usable
    st = _status
    if st is not None:
        return st
    with _lock:
        if _status is None:
            if native is None:
                st = _unavailable(IMPORT_ERROR or "the native module is missing")
            else:
                try:
                    st = dict(native.backend_status())
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # a bug in the native side must not break import
                    st = _unavailable(f"backend_status() failed: {type(exc).__name__}: {exc}")
            st.setdefault("devices", [])
            st.setdefault("reason", None)
            st["available"] = bool(st.get("available"))
            if st["available"] and not st["devices"]:
                st["available"] = False
                st["reason"] = st["reason"] or "no CUDA device found"
            _usable = frozenset(
                int(d["index"]) for d in st["devices"] if st["available"] and d.get("supported")
            )
            _status = st
        return _status


def usable_devices() -> frozenset[int]:
    """Indices of the CUDA devices flashscan's kernels can run on (empty when unavailable)."""
    u = _usable
    if u is None:
        status()
        u = _usable
        assert u is not None
    return u


def device_reason(device_id: int) -> str:
    """Why CUDA device `device_id` cannot run flashscan's kernels (for messages)."""
    st = status()
    if not st["available"]:
        return str(st.get("reason") or "the CUDA backend is unavailable")
    for d in st["devices"]:
        if int(d["index"]) == device_id:
            if d.get("supported"):
                return f"cuda:{device_id} is usable"
            cc = d.get("compute_capability")
            cc_s = f"sm_{cc[0]}{cc[1]}" if cc else "an unknown architecture"
            return (
                f"cuda:{device_id} ({d.get('name', '?')}) is {cc_s}; flashscan's kernels need "
                f"sm_80 or newer"
            )
    return f"cuda:{device_id} is not among the devices the CUDA driver reports"


def _reset_for_tests() -> None:
    """Forget the cached status, policy and the once-per-process warning (tests only)."""
    global _status, _usable, _policy, _warned
    with _lock:
        _status = None
        _usable = None
        _policy = None
        _warned = False


# ---------------------------------------------------------------------------------------------
# Fallback policy
# ---------------------------------------------------------------------------------------------

POLICIES = ("warn", "silent", "error")
_policy: str | None = None
_warned = False


def fallback_policy() -> str:
    """FLASHSCAN_FALLBACK (warn|silent|error, default warn), read once per process."""
    global _policy
    p = _policy
    if p is None:
        raw = os.environ.get("FLASHSCAN_FALLBACK", "warn")
        p = raw.strip().lower() or "warn"
        if p not in POLICIES:
            raise ValueError(
                f"FLASHSCAN_FALLBACK={raw!r} is not a valid fallback policy "
                f"(allowed: {', '.join(POLICIES)})"
            )
        _policy = p
    return p


def on_fallback(op: str, reason: str, policy: str | None = None, depth: int = 1) -> None:
    """Called before GPU arrays are sent through the host reference because the CUDA backend
    cannot serve them. `policy` overrides FLASHSCAN_FALLBACK (tests). Raises FlashscanError
    under `error`, warns once per process under `warn`, returns quietly under `silent`.
    `depth`: how many flashscan frames stand between this function and the user's call (the
    warning points at the user's line)."""
    global _warned
    p = fallback_policy() if policy is None else policy
    if p not in POLICIES:
        raise ValueError(f"fallback policy {p!r} is not one of {', '.join(POLICIES)}")
    if p == "error":
        raise FlashscanError(
            f"{op}: GPU arrays were given but the CUDA backend cannot run them ({reason}); "
            f"FLASHSCAN_FALLBACK=error forbids computing them on the host "
            f"(set FLASHSCAN_FALLBACK=warn or silent to allow the slow NumPy fallback)"
        )
    if p == "warn" and not _warned:
        _warned = True
        warnings.warn(
            f"flashscan: the CUDA backend cannot run {op} on these GPU arrays ({reason}); "
            f"computing on the host with the NumPy reference instead (slow: copies to host "
            f"and back). This warning is shown once; set FLASHSCAN_FALLBACK=silent to hide it "
            f"or FLASHSCAN_FALLBACK=error to make it an error.",
            FallbackWarning,
            stacklevel=2 + depth,
        )


# ---------------------------------------------------------------------------------------------
# Native servers (src/serve/): one native call per hot torch call
# ---------------------------------------------------------------------------------------------


def never() -> bool:
    """The compile test of a core module before its server exists (nothing to skip yet)."""
    return False


def make_server(module_native: Any, cls_name: str, grad: bool) -> tuple[Any, Any]:
    """A core module's native server `_native.<cls_name>` and torch.compiler.is_compiling
    (dynamo reads it as a constant True while tracing, and the module skips the server, whose
    native call it cannot trace). (None, None) while the module's `_native` is not the real one
    (tests swap in fakes that record every call: asked again next time); (False, None) where
    there is none (a build without the class, or torch not imported). `grad`: the server also
    takes torch.is_grad_enabled and torch.float32 (the scan's and the SSD's)."""
    if module_native is not native:
        return None, None
    cls = getattr(native, cls_name, None)
    torch = sys.modules.get("torch")
    if cls is None or torch is None:
        return False, None
    args = (torch.Tensor, torch.is_grad_enabled, torch.float32) if grad else (torch.Tensor,)
    return cls(*args), torch.compiler.is_compiling
