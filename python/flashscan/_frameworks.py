"""Framework detection and the per-framework operations the API needs.

Each array argument is classified once per Python type (the result is cached in `_HANDLERS`)
by its type's module — torch, cupy, jax, numpy, or any other object that speaks DLPack —
without importing any framework: a framework is only reached through `sys.modules` after the
caller has imported it (it must have, to hand us one of its arrays).

A handler `describe`s an array as the descriptor tuple of `_native.pyi`:

    (data_ptr, shape, strides (elements), dtype name, device_type (1 CPU, 2 CUDA), device_id)

which the checks read, and for torch the same tuple is what `_native` receives (the fast path
that skips `__dlpack__`). Other frameworks hand `_native` the array itself (DLPack).

Handlers also allocate outputs in the caller's framework on the caller's device, give the
caller's current stream, and move arrays to and from NumPy for the reference path (bfloat16
through float32: NumPy has none).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from . import _backend

__all__ = ["CPU", "CUDA", "Desc", "Handler", "contiguous_strides", "handler_of"]

CPU = 1
CUDA = 2

# (data_ptr, shape, strides in elements, dtype, device_type, device_id)
Desc = tuple[int, tuple[int, ...], tuple[int, ...], str, int, int]

_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal"}
_DEVICE_NAMES.update({9: "vpi", 10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi"})


def device_name(desc: Desc) -> str:
    """'cpu', 'cuda:0', ... for messages."""
    kind = desc[4]
    if kind == CPU:
        return "cpu"
    name = _DEVICE_NAMES.get(kind, f"dlpack-device-{kind}")
    return f"{name}:{desc[5]}"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) of `shape`."""
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(shape[i], 1)
    return tuple(strides)


def _np_dtype_name(dt: np.dtype) -> str:
    return dt.name  # float16, float32, float64, bfloat16 (ml_dtypes), int64...


def _host_float(a: np.ndarray) -> np.ndarray:
    """A NumPy array the reference accepts: bfloat16 (ml_dtypes) upcast to float32."""
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


class Handler:
    """Operations on one framework's arrays (one instance per framework)."""

    name = "?"
    #: _native receives the descriptor tuple (True) or the array itself (False).
    fast = False
    #: outputs allocated by `empty` must go through `finish` after the native call.
    needs_finish = False
    #: arrays of this framework can be written in place (out=, state).
    mutable = True
    #: every array of this framework is writable (no per-array read-only check needed).
    always_writable = False

    def describe(self, x: Any, arg: str) -> Desc:
        raise NotImplementedError

    def stream(self, device_id: int) -> int | None:
        """The caller's current stream on `device_id` (raw CUstream), or None."""
        return None

    def describe_new(self, x: Any, shape: tuple[int, ...], dtype: str, desc: Desc) -> Desc:
        """`describe` for an array `empty` just made on `desc`'s device (may skip queries)."""
        return self.describe(x, "out")

    def empty(self, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> Any:
        """A new uninitialised array of the framework, on `like`'s device."""
        raise NotImplementedError

    def finish(self, x: Any) -> Any:
        """Turn what `empty` returned into the caller's array, after the native call."""
        return x

    def writable(self, x: Any) -> bool:
        return True

    def to_host(self, x: Any) -> np.ndarray:
        """A NumPy copy/view of `x` the reference accepts (bfloat16 as float32)."""
        raise NotImplementedError

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Desc) -> Any:
        """`a` as an array of this framework with dtype `dtype` on `like`'s device."""
        raise NotImplementedError

    def copy_into(self, dst: Any, a: np.ndarray) -> None:
        """dst[...] = a (with a dtype cast), in place."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# numpy
# ---------------------------------------------------------------------------------------------


class NumpyHandler(Handler):
    name = "numpy"

    def describe(self, x: np.ndarray, arg: str) -> Desc:
        item = x.itemsize or 1
        strides = tuple(s // item for s in x.strides)
        return (0, x.shape, strides, _np_dtype_name(x.dtype), CPU, 0)

    def empty(self, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> np.ndarray:
        return np.empty(shape, dtype=_np_dtype(dtype, like))

    def writable(self, x: np.ndarray) -> bool:
        return bool(x.flags.writeable)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return _host_float(x)

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Desc) -> np.ndarray:
        dt = _np_dtype(dtype, like)
        return a if a.dtype == dt else a.astype(dt)

    def copy_into(self, dst: np.ndarray, a: np.ndarray) -> None:
        if dst is a:
            return
        dst[...] = a.astype(dst.dtype, copy=False)


def _np_dtype(dtype: str, like: Any) -> np.dtype:
    ldt = getattr(like, "dtype", None)
    if isinstance(ldt, np.dtype) and ldt.name == dtype:
        return ldt
    return np.dtype(dtype)


# ---------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------


class TorchHandler(Handler):
    name = "torch"
    fast = True
    always_writable = True

    def __init__(self) -> None:
        torch = sys.modules["torch"]
        self.torch = torch
        self.to_name: dict[Any, str] = {
            torch.float16: "float16",
            torch.bfloat16: "bfloat16",
            torch.float32: "float32",
            torch.float64: "float64",
            torch.int32: "int32",  # index tensors (cache_seqlens...), made by from_host too
        }
        self.from_name = {v: k for k, v in self.to_name.items()}
        # What the API's torch fast path (its per-signature plans) calls directly:
        #: device index -> the caller's current raw CUstream (torch's C function where it has one)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream: Callable[[int], int] = raw if raw is not None else self._stream_slow
        self.float32 = torch.float32

    def describe(self, t: Any, arg: str) -> Desc:
        dt = self.to_name.get(t.dtype)
        if dt is None:
            dt = str(t.dtype).replace("torch.", "")
        if t.is_cuda:
            # t.shape is a torch.Size: a tuple subclass (tuple() would cost ~0.2 us more)
            return (t.data_ptr(), t.shape, t.stride(), dt, CUDA, t.get_device())
        dev = t.device
        if dev.type != "cpu":
            raise ValueError(
                f"{arg}: torch tensors on device {dev} are not supported (allowed: cpu, cuda)"
            )
        if t.layout != self.torch.strided:
            raise TypeError(f"{arg}: torch tensors with layout {t.layout} are not supported")
        return (t.data_ptr(), t.shape, t.stride(), dt, CPU, 0)

    def describe_new(self, t: Any, shape: tuple[int, ...], dtype: str, desc: Desc) -> Desc:
        return (t.data_ptr(), shape, t.stride(), dtype, desc[4], desc[5])

    def stream(self, device_id: int) -> int:
        return self.current_stream(device_id)

    def _stream_slow(self, device_id: int) -> int:
        return self.torch.cuda.current_stream(device_id).cuda_stream

    def empty(self, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> Any:
        return like.new_empty(shape, dtype=self.from_name[dtype])

    def to_host(self, x: Any) -> np.ndarray:
        x = x.detach()
        if x.dtype == self.torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Desc) -> Any:
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        # non_blocking: a pageable source is staged by the driver before the call returns (so
        # `a` may go), and torch skips the stream synchronisation a blocking copy ends with
        return t.to(device=like.device, dtype=self.from_name[dtype], non_blocking=True)

    def copy_into(self, dst: Any, a: np.ndarray) -> None:
        src = self.torch.from_numpy(np.ascontiguousarray(a))
        if dst.device.type == "cpu" and dst.data_ptr() == src.data_ptr():
            return
        with self.torch.no_grad():
            dst.copy_(src)


# ---------------------------------------------------------------------------------------------
# cupy
# ---------------------------------------------------------------------------------------------


class CupyHandler(Handler):
    name = "cupy"
    always_writable = True

    def __init__(self) -> None:
        self.cupy = sys.modules["cupy"]

    def describe(self, x: Any, arg: str) -> Desc:
        item = x.itemsize or 1
        strides = tuple(s // item for s in x.strides)
        return (x.data.ptr, x.shape, strides, _np_dtype_name(x.dtype), CUDA, x.device.id)

    def stream(self, device_id: int) -> int:
        cp = self.cupy
        if cp.cuda.runtime.getDevice() == device_id:
            return cp.cuda.get_current_stream().ptr
        with cp.cuda.Device(device_id):
            return cp.cuda.get_current_stream().ptr

    def empty(self, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> Any:
        with like.device:
            return self.cupy.empty(shape, dtype=_np_dtype(dtype, like))

    def to_host(self, x: Any) -> np.ndarray:
        return _host_float(self.cupy.asnumpy(x))

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Desc) -> Any:
        with like.device:
            return self.cupy.asarray(a.astype(_np_dtype(dtype, like), copy=False))

    def copy_into(self, dst: Any, a: np.ndarray) -> None:
        with dst.device:
            dst[...] = self.cupy.asarray(a.astype(dst.dtype, copy=False))


# ---------------------------------------------------------------------------------------------
# jax (immutable arrays; no stream notion: _native uses its own stream and synchronises)
# ---------------------------------------------------------------------------------------------


class JaxHandler(Handler):
    name = "jax"
    needs_finish = True
    mutable = False

    def __init__(self) -> None:
        self.jax = sys.modules["jax"]
        import jax.dlpack  # noqa: F401  (jax is imported already: this is cheap)

    def describe(self, x: Any, arg: str) -> Desc:
        if type(x).__name__.endswith("Tracer"):
            raise TypeError(
                f"{arg}: got a jax tracer; flashscan operations cannot be traced by jax.jit "
                f"(call them outside jit on concrete arrays)"
            )
        try:
            kind, dev = x.__dlpack_device__()
        except Exception as exc:
            raise TypeError(f"{arg}: cannot locate this jax array's device ({exc})") from None
        shape = tuple(x.shape)
        return (0, shape, contiguous_strides(shape), _np_dtype_name(x.dtype), int(kind), int(dev))

    def empty(self, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> Any:
        nat = _backend.native
        assert nat is not None
        return nat.empty(shape, dtype, desc[5], None)

    def finish(self, x: Any) -> Any:
        return self.jax.dlpack.from_dlpack(x)

    def writable(self, x: Any) -> bool:
        return False

    def to_host(self, x: Any) -> np.ndarray:
        return _host_float(np.asarray(x))

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Desc) -> Any:
        jnp = sys.modules["jax.numpy"] if "jax.numpy" in sys.modules else self.jax.numpy
        arr = jnp.asarray(a, dtype=getattr(jnp, dtype))
        devices = like.devices() if hasattr(like, "devices") else None
        if devices and len(devices) == 1:
            arr = self.jax.device_put(arr, next(iter(devices)))
        return arr

    def copy_into(self, dst: Any, a: np.ndarray) -> None:
        raise TypeError("jax arrays are immutable and cannot be written in place")


# ---------------------------------------------------------------------------------------------
# anything else that speaks DLPack
# ---------------------------------------------------------------------------------------------


class DlpackHandler(Handler):
    """An object of an unknown framework with `__dlpack__`/`__dlpack_device__`. CPU objects are
    read through `numpy.from_dlpack` (results come back as NumPy arrays); CUDA objects are read
    by `_native.describe` and results come back as `_native.empty` buffers (DLPack objects)."""

    name = "dlpack"

    def describe(self, x: Any, arg: str) -> Desc:
        try:
            kind, dev = x.__dlpack_device__()
        except Exception as exc:
            raise TypeError(
                f"{arg}: {type(x).__name__}.__dlpack_device__() failed: {exc}"
            ) from None
        if kind == CPU:
            try:
                a = np.from_dlpack(x)
            except Exception as exc:
                raise TypeError(
                    f"{arg}: cannot read this {type(x).__name__} via DLPack: {exc}"
                ) from None
            d = NUMPY.describe(a, arg)
            return d
        nat = _backend.native
        if nat is None:
            raise _backend.FlashscanError(
                f"{arg}: a {type(x).__name__} on DLPack device type {kind} needs the native "
                f"module to be read ({_backend.IMPORT_ERROR})"
            )
        info = nat.describe(x)
        return (
            int(info["data_ptr"]),
            tuple(info["shape"]),
            tuple(info["strides"]),
            str(info["dtype"]),
            int(info["device_type"]),
            int(info["device_id"]),
        )

    def empty(self, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> Any:
        if desc[4] == CPU:
            return np.empty(shape, dtype=np.dtype(dtype))
        nat = _backend.native
        assert nat is not None
        return nat.empty(shape, dtype, desc[5], None)

    def writable(self, x: Any) -> bool:
        kind, _ = x.__dlpack_device__()
        if kind == CPU:
            try:
                return bool(np.from_dlpack(x).flags.writeable)
            except Exception:
                return False
        nat = _backend.native
        return nat is None or not nat.describe(x).get("readonly", False)

    def to_host(self, x: Any) -> np.ndarray:
        kind, _ = x.__dlpack_device__()
        if kind != CPU:
            raise _backend.FlashscanError(
                f"cannot copy a {type(x).__name__} on DLPack device type {kind} to the host "
                f"for the NumPy fallback (pass torch, cupy or jax arrays)"
            )
        return _host_float(np.from_dlpack(x))

    def from_host(self, a: np.ndarray, dtype: str, like: Any, desc: Desc) -> Any:
        if desc[4] != CPU:
            raise _backend.FlashscanError(
                f"cannot move a result back to a {type(like).__name__} on a GPU without the "
                f"CUDA backend"
            )
        return a.astype(np.dtype(dtype), copy=False)

    def copy_into(self, dst: Any, a: np.ndarray) -> None:
        kind, _ = dst.__dlpack_device__()
        if kind != CPU:
            raise _backend.FlashscanError(
                f"cannot write into a {type(dst).__name__} on a GPU without the CUDA backend"
            )
        view = np.from_dlpack(dst)
        view[...] = a.astype(view.dtype, copy=False)


NUMPY = NumpyHandler()
_DLPACK = DlpackHandler()

# type -> handler; numpy's ndarray is known up front, the rest are added on first sight.
_HANDLERS: dict[type, Handler] = {np.ndarray: NUMPY}
#: the types `_HANDLERS` maps to the torch handler (torch.Tensor, nn.Parameter...): the API's
#: torch fast path tests membership here before it calls any torch method on an argument.
TORCH_TYPES: set[type] = set()
_SINGLETONS: dict[str, Handler] = {}


def _singleton(name: str, factory: Callable[[], Handler]) -> Handler:
    h = _SINGLETONS.get(name)
    if h is None:
        h = factory()
        _SINGLETONS[name] = h
    return h


def _resolve(x: Any, arg: str) -> Handler:
    """Classify `x`'s type (slow path, once per type)."""
    tp = type(x)
    module = getattr(tp, "__module__", "") or ""
    root = module.split(".", 1)[0]
    h: Handler | None = None
    if root == "torch" and "torch" in sys.modules:
        h = _singleton("torch", TorchHandler)
    elif root == "cupy" and "cupy" in sys.modules:
        h = _singleton("cupy", CupyHandler)
    elif root in ("jax", "jaxlib") and "jax" in sys.modules:
        h = _singleton("jax", JaxHandler)
    elif isinstance(x, np.ndarray):
        h = NUMPY
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        h = _DLPACK
    if h is None:
        raise TypeError(
            f"{arg}: expected an array (torch, cupy, jax or numpy, or any object supporting "
            f"DLPack), got {tp.__module__}.{tp.__qualname__}"
            if tp.__module__ != "builtins"
            else f"{arg}: expected an array (torch, cupy, jax or numpy, or any object "
            f"supporting DLPack), got {tp.__qualname__}"
        )
    _HANDLERS[tp] = h
    if isinstance(h, TorchHandler):
        TORCH_TYPES.add(tp)
    return h


def grad_enabled() -> bool:
    """torch's grad mode (only asked once a torch input requires grad)."""
    return bool(sys.modules["torch"].is_grad_enabled())


def needs_autograd(h: Handler, objs: tuple[Any, ...]) -> bool:
    """True for torch arrays of which one requires grad, with grad mode on: such calls go to
    the differentiable ops of `flashscan.torch`."""
    return (
        isinstance(h, TorchHandler)
        and any(o is not None and getattr(o, "requires_grad", False) for o in objs)
        and bool(h.torch.is_grad_enabled())
    )


def handler_of(x: Any, arg: str) -> Handler:
    """The handler for `x`'s framework (cached per type)."""
    h = _HANDLERS.get(type(x))
    if h is None:
        h = _resolve(x, arg)
    return h


# ---------------------------------------------------------------------------------------------
# Outputs of a native call (the general paths of the attention ops)
# ---------------------------------------------------------------------------------------------


def new_output(h: Handler, shape: tuple[int, ...], dtype: str, like: Any, desc: Desc) -> Any:
    """A new array of `h`'s framework on `like`'s device (`desc` describes `like`), and what
    `_native` takes for it: its descriptor when `h` is fast, else the array itself."""
    a = h.empty(shape, dtype, like, desc)
    return a, (h.describe_new(a, shape, dtype, desc) if h.fast else a)


def out_and_lse(
    h: Handler,
    q: Any,
    dq: Desc,
    out: Any,
    ho: Handler | None,
    do: Desc | None,
    lse_shape: tuple[int, ...] | None,
) -> tuple[Any, Any, Any, Any]:
    """An attention call's outputs, allocated like q (handler `h`, descriptor `dq`): out (the
    caller's `out=`, with its handler `ho` and descriptor `do`, when given; else new, q's
    shape and dtype) and, with `lse_shape`, a new float32 lse. Returns (out, out for
    `_native`, lse, lse for `_native`); the lse pair is None without lse_shape. After the
    native call, `finished` turns them into the caller's arrays."""
    if out is None:
        out, oa = new_output(h, dq[1], dq[3], q, dq)
    else:
        assert ho is not None
        oa = do if ho.fast else out
    if lse_shape is None:
        return out, oa, None, None
    lse, la = new_output(h, lse_shape, "float32", q, dq)
    return out, oa, lse, la


def finished(h: Handler, out: Any, lse: Any) -> tuple[Any, Any]:
    """`out_and_lse`'s arrays after the native call, as the caller gets them (jax wraps what
    it allocated; lse may be None)."""
    if h.needs_finish:
        out = h.finish(out)
        if lse is not None:
            lse = h.finish(lse)
    return out, lse
