"""Argument validation shared by the GPU and the reference paths.

Every check reads descriptor tuples (see `_frameworks.Desc`) and raises, with a message that
names the argument, what it got and what is allowed:
- TypeError for a wrong kind of thing (not an array, wrong dtype, mixed dtypes, a bad option type);
- ValueError for a wrong value (rank, shape, mismatched sizes, devices, strides, read-only out=);
- UnsupportedError for a valid request flashscan does not serve (head dim > 256, dstate > 256).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._backend import UnsupportedError
from ._frameworks import CPU, CUDA, Desc, Handler, device_name

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
MAX_HEADDIM = 256
MAX_DSTATE = 256

_ALLOWED_FLOATS = "float16, bfloat16 or float32"


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def dtype_in(arg: str, d: Desc, allowed: tuple[str, ...] = FLOAT_DTYPES) -> None:
    if d[3] not in allowed:
        names = ", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0]
        raise TypeError(f"{arg}: expected dtype {names}, got {d[3]}")


def same_dtype(arg: str, d: Desc, ref_arg: str, ref: Desc, role: str = "") -> None:
    if d[3] != ref[3]:
        extra = f" ({role})" if role else ""
        raise TypeError(
            f"{arg}: dtype {d[3]} does not match {ref_arg}'s dtype {ref[3]}{extra}; mixed dtypes "
            f"are not allowed"
        )


def rank(arg: str, d: Desc, ranks: tuple[int, ...], layout: str) -> int:
    n = len(d[1])
    if n not in ranks:
        want = " or ".join(f"{r}-D" for r in ranks)
        raise ValueError(
            f"{arg}: expected a {want} array {layout}, got shape {fmt_shape(d[1])} ({n}-D)"
        )
    return n


def shape_eq(arg: str, d: Desc, expect: tuple[int, ...], what: str) -> None:
    if tuple(d[1]) != tuple(expect):
        raise ValueError(f"{arg}: expected shape {fmt_shape(expect)} {what}, got {fmt_shape(d[1])}")


def device_kind(arg: str, d: Desc) -> None:
    if d[4] != CPU and d[4] != CUDA:
        raise ValueError(
            f"{arg}: arrays on device {device_name(d)} are not supported (allowed: cpu, cuda)"
        )


def same_device(arg: str, d: Desc, ref_arg: str, ref: Desc) -> None:
    if d[4] == ref[4] and (d[5] == ref[5] or d[4] == CPU):
        return
    device_kind(arg, d)
    if d[4] != ref[4]:
        raise ValueError(
            f"{arg}: is on {device_name(d)} but {ref_arg} is on {device_name(ref)}; mixing CPU "
            f"and GPU arrays is not allowed (move them to one device)"
        )
    raise ValueError(
        f"{arg}: is on {device_name(d)} but {ref_arg} is on {device_name(ref)}; all arrays "
        f"must be on the same device"
    )


def contiguous_last(arg: str, d: Desc, dim_name: str) -> None:
    shape, strides = d[1], d[2]
    if shape and shape[-1] > 1 and strides[-1] != 1 and 0 not in shape:
        raise ValueError(
            f"{arg}: its last dimension ({dim_name}) must be contiguous (stride 1), got strides "
            f"{fmt_shape(strides)} for shape {fmt_shape(shape)} (call .contiguous() first)"
        )


def writable(arg: str, x: Any, h: Handler) -> None:
    if not h.mutable:
        raise TypeError(
            f"{arg}: {h.name} arrays are immutable and cannot be written in place "
            f"(pass a torch or cupy tensor, or leave it out)"
        )
    if not h.writable(x):
        raise ValueError(f"{arg}: the array is read-only; a writable array is required")


def out_like(
    arg: str,
    x: Any,
    h: Handler,
    d: Desc,
    shape: tuple[int, ...],
    dtype: str,
    ref_arg: str,
    ref: Desc,
    what: str,
) -> None:
    """`out=`-style arrays: exact shape and dtype, same device, writable."""
    if tuple(d[1]) != tuple(shape):
        raise ValueError(f"{arg}: expected shape {fmt_shape(shape)} {what}, got {fmt_shape(d[1])}")
    if d[3] != dtype:
        raise TypeError(f"{arg}: expected dtype {dtype} {what}, got {d[3]}")
    same_device(arg, d, ref_arg, ref)
    if not h.always_writable:
        writable(arg, x, h)


def flag(arg: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # numpy bools and 0/1 are accepted too
        return bool(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{arg}: expected a bool, got {value!r}")


def real(arg: str, value: Any, *, minimum: float | None = None) -> float:
    """A finite real number (Python, NumPy or 0-d torch scalars), optionally >= minimum."""
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{arg}: expected a real number, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{arg}: expected a real number, got {value!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"{arg}: expected a finite number, got {value!r}")
    if minimum is not None and f < minimum:
        raise ValueError(f"{arg}: expected a number >= {minimum}, got {value!r}")
    return f


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def attention(dq: Desc, dk: Desc, dv: Desc) -> tuple[int, int, int, int, int, int]:
    """q (b, sq, h, d), k/v (b, sk, hk, d). Returns (b, sq, h, d, sk, hk)."""
    layout = "(batch, seqlen, nheads, headdim)"
    rank("q", dq, (4,), layout)
    rank("k", dk, (4,), layout)
    rank("v", dv, (4,), layout)
    device_kind("q", dq)
    dtype_in("q", dq)
    same_dtype("k", dk, "q", dq, "q, k and v must share one dtype")
    same_dtype("v", dv, "q", dq, "q, k and v must share one dtype")
    same_device("k", dk, "q", dq)
    same_device("v", dv, "q", dq)
    b, sq, h, d = dq[1]
    bk, sk, hk, dk_ = dk[1]
    if bk != b:
        raise ValueError(f"k: batch {bk} does not match q's batch {b} (shape {fmt_shape(dk[1])})")
    if dk_ != d:
        raise ValueError(f"k: headdim {dk_} does not match q's headdim {d}")
    if tuple(dv[1]) != tuple(dk[1]):
        raise ValueError(
            f"v: shape {fmt_shape(dv[1])} does not match k's shape {fmt_shape(dk[1])} "
            f"(v must be (batch, seqlen_k, nheads_k, headdim) like k)"
        )
    if hk < 1:
        raise ValueError(f"k: nheads_k must be >= 1, got shape {fmt_shape(dk[1])}")
    if h % hk:
        raise ValueError(
            f"q: nheads {h} is not a multiple of k's nheads_k {hk} (GQA/MQA needs "
            f"nheads % nheads_k == 0)"
        )
    if d > MAX_HEADDIM:
        raise UnsupportedError(
            f"q: headdim {d} is not supported (flashscan supports head dims up to {MAX_HEADDIM})"
        )
    if d < 8 or d % 8:
        raise ValueError(
            f"q: headdim {d} is not allowed (allowed: multiples of 8 from 8 to {MAX_HEADDIM})"
        )
    contiguous_last("q", dq, "headdim")
    contiguous_last("k", dk, "headdim")
    contiguous_last("v", dv, "headdim")
    return b, sq, h, d, sk, hk


def window(window_size: Any, causal: bool) -> tuple[int, int]:
    """(window_left, window_right) as the kernel takes them: -1 unbounded, causal => right 0."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(
            f"window_size: expected a pair of ints (left, right), got {window_size!r}"
        ) from None
    for name, w in (("left", left), ("right", right)):
        if isinstance(w, bool) or not hasattr(w, "__index__"):
            raise TypeError(f"window_size: {name} must be an int, got {w!r}")
        if int(w) < -1:
            raise ValueError(
                f"window_size: {name} must be -1 (unbounded) or >= 0, got {int(w)} "
                f"(window_size={tuple(window_size)!r})"
            )
    wl = int(left)
    wr = 0 if causal else int(right)
    return wl, wr


# ---------------------------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------------------------


def _weight(
    arg: str, d: Desc, shape: tuple[int, ...], layout: str, ref_arg: str, ref: Desc
) -> None:
    """A float32 parameter (A, D, delta_bias...) of exactly `shape`."""
    rank(arg, d, (len(shape),), layout)
    dtype_in(arg, d, ("float32",))
    if tuple(d[1]) != shape:
        raise ValueError(
            f"{arg}: expected shape {fmt_shape(shape)} {layout}, got {fmt_shape(d[1])}"
        )
    same_device(arg, d, ref_arg, ref)


def _dstate(arg: str, n: int) -> None:
    if n > MAX_DSTATE:
        raise UnsupportedError(
            f"{arg}: dstate {n} is not supported (flashscan supports dstate 1..{MAX_DSTATE})"
        )
    if n < 1:
        raise ValueError(f"{arg}: dstate must be >= 1, got {n}")


def _bc_dtype(arg: str, d: Desc, ref_arg: str, ref: Desc) -> None:
    dtype_in(arg, d)
    if d[3] != ref[3] and d[3] != "float32":
        allowed = "float32" if ref[3] == "float32" else f"{ref[3]} (like {ref_arg}) or float32"
        raise TypeError(
            f"{arg}: dtype {d[3]} is not allowed with {ref_arg} in {ref[3]} (allowed: {allowed})"
        )


def selective_scan(
    du: Desc,
    ddelta: Desc,
    dA: Desc,
    dB: Desc,
    dC: Desc,
    dD: Desc | None,
    dz: Desc | None,
    dbias: Desc | None,
    dinit: Desc | None,
) -> tuple[int, int, int, int]:
    """mamba_ssm's selective_scan_fn shapes. Returns (batch, dim, seqlen, dstate)."""
    seq_layout = "(batch, dim, seqlen)"
    rank("u", du, (3,), seq_layout)
    device_kind("u", du)
    dtype_in("u", du)
    batch, dim, seqlen = du[1]
    rank("delta", ddelta, (3,), seq_layout)
    same_dtype("delta", ddelta, "u", du)
    shape_eq("delta", ddelta, du[1], "(like u)")
    same_device("delta", ddelta, "u", du)

    rank("A", dA, (2,), "(dim, dstate)")
    dtype_in("A", dA, ("float32",))
    if dA[1][0] != dim:
        raise ValueError(f"A: expected shape (dim={dim}, dstate), got {fmt_shape(dA[1])}")
    same_device("A", dA, "u", du)
    dstate = dA[1][1]
    _dstate("A", dstate)

    groups: dict[str, int] = {}
    for arg, d in (("B", dB), ("C", dC)):
        n = rank(
            arg,
            d,
            (2, 3, 4),
            "(dim, dstate), (batch, dstate, seqlen) or (batch, ngroups, dstate, seqlen)",
        )
        _bc_dtype(arg, d, "u", du)
        same_device(arg, d, "u", du)
        if n == 2:
            shape_eq(arg, d, (dim, dstate), "(dim, dstate), fixed over time")
            continue
        if n == 3:
            shape_eq(arg, d, (batch, dstate, seqlen), "(batch, dstate, seqlen)")
            groups[arg] = 1
        else:
            g = d[1][1]
            if g < 1 or dim % g:
                raise ValueError(
                    f"{arg}: ngroups {g} must divide dim {dim} (shape {fmt_shape(d[1])})"
                )
            shape_eq(arg, d, (batch, g, dstate, seqlen), "(batch, ngroups, dstate, seqlen)")
            groups[arg] = g
        contiguous_last(arg, d, "seqlen")
    if len(groups) == 2 and groups["B"] != groups["C"]:
        raise ValueError(
            f"C: ngroups {groups['C']} does not match B's ngroups {groups['B']} "
            f"(varying B and C must have the same number of groups)"
        )

    if dD is not None:
        _weight("D", dD, (dim,), "(dim,)", "u", du)
    if dbias is not None:
        _weight("delta_bias", dbias, (dim,), "(dim,)", "u", du)
    if dz is not None:
        rank("z", dz, (3,), seq_layout)
        same_dtype("z", dz, "u", du)
        shape_eq("z", dz, du[1], "(like u)")
        same_device("z", dz, "u", du)
        contiguous_last("z", dz, "seqlen")
    if dinit is not None:
        rank("initial_state", dinit, (3,), "(batch, dim, dstate)")
        dtype_in("initial_state", dinit, ("float32",))
        shape_eq("initial_state", dinit, (batch, dim, dstate), "(batch, dim, dstate)")
        same_device("initial_state", dinit, "u", du)
    contiguous_last("u", du, "seqlen")
    contiguous_last("delta", ddelta, "seqlen")
    return batch, dim, seqlen, dstate


def state_update(
    dstate_: Desc,
    dx: Desc,
    ddt: Desc,
    dA: Desc,
    dB: Desc,
    dC: Desc,
    dD: Desc | None,
    dz: Desc | None,
    dbias: Desc | None,
) -> tuple[int, int, int, int, int]:
    """mamba_ssm's selective_state_update shapes, with or without a heads axis.
    Returns (batch, nheads, dim, dstate, ngroups) (nheads = ngroups = 1 without heads)."""
    n = rank("state", dstate_, (3, 4), "(batch, dim, dstate) or (batch, nheads, dim, dstate)")
    device_kind("state", dstate_)
    dtype_in("state", dstate_, ("float32",))
    heads = n == 4
    if heads:
        batch, nheads, dim, dstate = dstate_[1]
        x_shape: tuple[int, ...] = (batch, nheads, dim)
        x_layout = "(batch, nheads, dim)"
        a_shape: tuple[int, ...] = (nheads, dim, dstate)
        a_layout = "(nheads, dim, dstate)"
        w_shape: tuple[int, ...] = (nheads, dim)
        w_layout = "(nheads, dim)"
    else:
        batch, dim, dstate = dstate_[1]
        nheads = 1
        x_shape, x_layout = (batch, dim), "(batch, dim)"
        a_shape, a_layout = (dim, dstate), "(dim, dstate)"
        w_shape, w_layout = (dim,), "(dim,)"
    _dstate("state", dstate)

    rank("x", dx, (len(x_shape),), f"{x_layout} to go with state {fmt_shape(dstate_[1])}")
    dtype_in("x", dx)
    shape_eq("x", dx, x_shape, f"{x_layout} to go with state {fmt_shape(dstate_[1])}")
    same_device("x", dx, "state", dstate_)
    for arg, d in (("dt", ddt), ("z", dz)):
        if d is None:
            continue
        rank(arg, d, (len(x_shape),), f"{x_layout} (like x)")
        same_dtype(arg, d, "x", dx)
        shape_eq(arg, d, x_shape, f"{x_layout} (like x)")
        same_device(arg, d, "state", dstate_)

    _weight("A", dA, a_shape, a_layout, "state", dstate_)

    ngroups = 1
    seen: dict[str, int] = {}
    for arg, d in (("B", dB), ("C", dC)):
        if heads:
            rank(arg, d, (3,), "(batch, ngroups, dstate)")
            g = d[1][1]
            if g < 1 or nheads % g:
                raise ValueError(
                    f"{arg}: ngroups {g} must divide nheads {nheads} (shape {fmt_shape(d[1])})"
                )
            shape_eq(arg, d, (batch, g, dstate), "(batch, ngroups, dstate)")
            seen[arg] = g
        else:
            rank(arg, d, (2,), "(batch, dstate)")
            shape_eq(arg, d, (batch, dstate), "(batch, dstate)")
        _bc_dtype(arg, d, "x", dx)
        same_device(arg, d, "state", dstate_)
    if seen:
        if seen["B"] != seen["C"]:
            raise ValueError(
                f"C: ngroups {seen['C']} does not match B's ngroups {seen['B']} "
                f"(B and C must have the same number of groups)"
            )
        ngroups = seen["B"]

    for arg, d in (("D", dD), ("dt_bias", dbias)):
        if d is None:
            continue
        _weight(arg, d, w_shape, w_layout, "state", dstate_)
    return batch, nheads, dim, dstate, ngroups


# ---------------------------------------------------------------------------------------------
# Memoised entry points (the hot path)
# ---------------------------------------------------------------------------------------------
# The checks above read only shapes, strides, dtypes and devices (never data pointers), so a
# call whose descriptors match an earlier valid call's, pointers aside, needs no re-checking:
# real-time callers repeat the same shapes thousands of times a second. Invalid calls raise
# and are never remembered.

_MEMO_SIZE = 512
_memo_attention: dict[Any, tuple[int, int, int, int, int, int]] = {}
_memo_scan: dict[Any, tuple[int, int, int, int]] = {}
_memo_state: dict[Any, tuple[int, int, int, int, int]] = {}


def remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """memo[key] = value, the memo emptied first when it holds _MEMO_SIZE entries."""
    if len(memo) >= _MEMO_SIZE:
        memo.clear()
    memo[key] = value


def attention_memo(dq: Desc, dk: Desc, dv: Desc) -> tuple[int, int, int, int, int, int]:
    """`attention`, remembered per (shape, strides, dtype, device) signature."""
    key = (dq[1:], dk[1:], dv[1:])
    r = _memo_attention.get(key)
    if r is None:
        r = attention(dq, dk, dv)
        remember(_memo_attention, key, r)
    return r


def selective_scan_memo(
    du: Desc,
    ddelta: Desc,
    dA: Desc,
    dB: Desc,
    dC: Desc,
    dD: Desc | None,
    dz: Desc | None,
    dbias: Desc | None,
    dinit: Desc | None,
) -> tuple[int, int, int, int]:
    """`selective_scan`, remembered per signature."""
    key = (
        du[1:],
        ddelta[1:],
        dA[1:],
        dB[1:],
        dC[1:],
        dD and dD[1:],
        dz and dz[1:],
        dbias and dbias[1:],
        dinit and dinit[1:],
    )
    r = _memo_scan.get(key)
    if r is None:
        r = selective_scan(du, ddelta, dA, dB, dC, dD, dz, dbias, dinit)
        remember(_memo_scan, key, r)
    return r


def state_update_memo(
    dstate_: Desc,
    dx: Desc,
    ddt: Desc,
    dA: Desc,
    dB: Desc,
    dC: Desc,
    dD: Desc | None,
    dz: Desc | None,
    dbias: Desc | None,
) -> tuple[int, int, int, int, int]:
    """`state_update`, remembered per signature."""
    key = (
        dstate_[1:],
        dx[1:],
        ddt[1:],
        dA[1:],
        dB[1:],
        dC[1:],
        dD and dD[1:],
        dz and dz[1:],
        dbias and dbias[1:],
    )
    r = _memo_state.get(key)
    if r is None:
        r = state_update(dstate_, dx, ddt, dA, dB, dC, dD, dz, dbias)
        remember(_memo_state, key, r)
    return r
