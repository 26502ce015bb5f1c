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


NO_WINDOW = (-1, -1)
_INF = math.inf


def attention_options(
    headdim: Any,
    causal: Any,
    window_size: Any,
    softmax_scale: Any,
    softcap: Any,
    return_lse: Any,
) -> tuple[float, int, int, float, bool, bool]:
    """The options every attention entry takes (dense, varlen, kvcache; the torch and jax
    adapters), checked in this order: causal, return_lse, window_size, softmax_scale, softcap.
    Returns (scale, window_left, window_right, softcap, causal, return_lse) as the kernels take
    them: scale defaults to 1/sqrt(headdim), causal sets window_right 0. Plain values (bools,
    finite floats, the unbounded window) skip the checkers: the torch decode loop calls this
    on every step. (`attention.flash_attn_func`'s plan path keeps a copy of these lines
    inline: it cannot afford the call.)"""
    if causal is not False and causal is not True:
        causal = flag("causal", causal)
    if return_lse is not False and return_lse is not True:
        return_lse = flag("return_lse", return_lse)
    if window_size is NO_WINDOW or (type(window_size) is tuple and window_size == NO_WINDOW):
        wl, wr = -1, (0 if causal else -1)
    else:
        wl, wr = window(window_size, causal)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(headdim)
    elif type(softmax_scale) is float and -_INF < softmax_scale < _INF:
        scale = softmax_scale
    else:
        scale = real("softmax_scale", softmax_scale)
    if type(softcap) is float and 0.0 <= softcap < _INF:
        cap = softcap
    else:
        cap = real("softcap", softcap, minimum=0.0)
    return scale, wl, wr, cap, causal, return_lse


def varlen(
    dq: Desc, dk: Desc, dv: Desc, dcq: Desc, dck: Desc
) -> tuple[int, int, int, int, int, int]:
    """flash_attn_varlen_func: q (total_q, h, d), k/v (total_k, hk, d), cu_seqlens_q/k int32
    (batch + 1,) on q's device. Returns (batch, total_q, h, d, total_k, hk)."""
    rank("q", dq, (3,), "(total_q, nheads, headdim)")
    rank("k", dk, (3,), "(total_k, nheads_k, headdim)")
    rank("v", dv, (3,), "(total_k, nheads_k, headdim)")
    # the dense checks on the batch-1 view: dtypes, devices, head dims, GQA, strides
    as4 = [(x[0], (1, *x[1]), (0, *x[2]), *x[3:]) for x in (dq, dk, dv)]
    _, tq, h, d, tk, hk = attention(*as4)  # type: ignore[arg-type]
    batch = -1
    for arg, dc in (("cu_seqlens_q", dcq), ("cu_seqlens_k", dck)):
        rank(arg, dc, (1,), "(batch + 1,)")
        dtype_in(arg, dc, ("int32",))
        same_device(arg, dc, "q", dq)
        n = dc[1][0]
        if n < 1:
            raise ValueError(f"{arg}: expected batch + 1 >= 1 entries (0, then each end), got 0")
        if n > 1 and dc[2][0] != 1:
            raise ValueError(
                f"{arg}: must be contiguous (stride 1), got stride {dc[2][0]} "
                "(call .contiguous() first)"
            )
        if batch >= 0 and n - 1 != batch:
            raise ValueError(
                f"cu_seqlens_k: {n} entries but cu_seqlens_q has {batch + 1}; both are (batch + 1,)"
            )
        batch = n - 1
    return batch, tq, h, d, tk, hk


def cu_seqlens_values(arg: str, cu: np.ndarray, total: int, max_seqlen: int, max_arg: str) -> None:
    """Host-visible cu_seqlens: starts at 0, non-decreasing, ends at total, every length <=
    max_seqlen (the kernels cover max_seqlen rows per sequence)."""
    c = np.asarray(cu, dtype=np.int64).reshape(-1)
    if c[0] != 0:
        raise ValueError(f"{arg}: must start at 0, got {int(c[0])} (values {_head(c)})")
    lens = np.diff(c)
    if lens.size and lens.min() < 0:
        i = int(np.argmin(lens))
        raise ValueError(
            f"{arg}: must be non-decreasing, but entry {i + 1} ({int(c[i + 1])}) < entry {i} "
            f"({int(c[i])}) (values {_head(c)})"
        )
    if c[-1] != total:
        raise ValueError(
            f"{arg}: its last entry {int(c[-1])} must equal the packed length {total} "
            f"(values {_head(c)})"
        )
    if lens.size and lens.max() > max_seqlen:
        i = int(np.argmax(lens))
        raise ValueError(
            f"{arg}: sequence {i} has length {int(lens[i])} > {max_arg} = {max_seqlen}; "
            f"{max_arg} must be at least the longest sequence"
        )


def _head(c: np.ndarray) -> str:
    items = ", ".join(str(int(x)) for x in c[:8])
    return f"[{items}{', ...' if c.size > 8 else ''}]"


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


# ---------------------------------------------------------------------------------------------
# Attention with a KV cache
# ---------------------------------------------------------------------------------------------

INDEX_DTYPES = ("int32",)
#: a paged cache's block_size must be a multiple of this (the native core's key tile)
PAGE_MULTIPLE = 16


def _batch_index(arg: str, d: Desc, batch: int, ref: Desc) -> None:
    """An int32 (batch,) index tensor (cache_seqlens, cache_batch_idx, cache_leftpad) on q's
    device, contiguous."""
    rank(arg, d, (1,), "(batch,)")
    dtype_in(arg, d, INDEX_DTYPES)
    shape_eq(arg, d, (batch,), "(batch,)")
    same_device(arg, d, "q", ref)
    contiguous_last(arg, d, "batch")


def kvcache(
    dq: Desc,
    dkc: Desc,
    dvc: Desc,
    dk: Desc | None,
    dv: Desc | None,
    dcos: Desc | None,
    dsin: Desc | None,
    dseq: Desc | None,
    dbidx: Desc | None,
    dpad: Desc | None,
    dbt: Desc | None,
) -> tuple[int, int, int, int, int, int, int, bool, int, int]:
    """flash_attn_with_kvcache's shapes, dtypes and devices (the values inside the index tensors
    are `kvcache_values`' job). dseq is None for an int cache_seqlens or none at all.
    Returns (batch, seqlen_q, nheads, headdim, nheads_k, seqlen_new, capacity, paged,
    block_size, rows) with rows = batch_cache (contiguous) or num_blocks (paged)."""
    rank("q", dq, (4,), "(batch, seqlen_q, nheads, headdim)")
    device_kind("q", dq)
    dtype_in("q", dq)
    b, sq, h, d = dq[1]
    paged = dbt is not None
    cache_layout = (
        "(num_blocks, block_size, nheads_k, headdim) (paged: block_table is given)"
        if paged
        else "(batch_cache, seqlen_cache, nheads_k, headdim)"
    )
    rank("k_cache", dkc, (4,), cache_layout)
    same_dtype("k_cache", dkc, "q", dq, "q, k_cache, v_cache, k and v must share one dtype")
    same_device("k_cache", dkc, "q", dq)
    rank("v_cache", dvc, (4,), cache_layout)
    same_dtype("v_cache", dvc, "q", dq, "q, k_cache, v_cache, k and v must share one dtype")
    same_device("v_cache", dvc, "q", dq)
    if tuple(dvc[1]) != tuple(dkc[1]):
        raise ValueError(
            f"v_cache: shape {fmt_shape(dvc[1])} does not match k_cache's shape "
            f"{fmt_shape(dkc[1])} (v_cache must be {cache_layout} like k_cache)"
        )
    rows, slots, hk, dc = dkc[1]
    if dc != d:
        raise ValueError(
            f"k_cache: headdim {dc} does not match q's headdim {d} (shape {fmt_shape(dkc[1])})"
        )
    if hk < 1:
        raise ValueError(f"k_cache: nheads_k must be >= 1, got shape {fmt_shape(dkc[1])}")
    if h < 1 or h % hk:
        raise ValueError(
            f"q: nheads {h} is not a positive multiple of k_cache's nheads_k {hk} (GQA/MQA "
            f"needs nheads % nheads_k == 0)"
        )
    if d > MAX_HEADDIM:
        raise UnsupportedError(
            f"q: headdim {d} is not supported (flashscan supports head dims up to {MAX_HEADDIM})"
        )
    if d < 8 or d % 8:
        raise ValueError(
            f"q: headdim {d} is not allowed (allowed: multiples of 8 from 8 to {MAX_HEADDIM})"
        )
    if sq < 1:
        raise ValueError(f"q: seqlen_q must be >= 1, got shape {fmt_shape(dq[1])}")

    if paged:
        assert dbt is not None
        rank("block_table", dbt, (2,), "(batch, max_blocks_per_seq)")
        dtype_in("block_table", dbt, INDEX_DTYPES)
        if dbt[1][0] != b:
            raise ValueError(
                f"block_table: expected shape (batch={b}, max_blocks_per_seq), got "
                f"{fmt_shape(dbt[1])}"
            )
        same_device("block_table", dbt, "q", dq)
        contiguous_last("block_table", dbt, "max_blocks_per_seq")
        if slots < 1 or slots % PAGE_MULTIPLE:
            raise ValueError(
                f"k_cache: block_size {slots} is not allowed (a paged cache's block_size must "
                f"be a positive multiple of {PAGE_MULTIPLE}; shape {fmt_shape(dkc[1])})"
            )
        if dbidx is not None:
            raise ValueError(
                "cache_batch_idx: not allowed with block_table (a paged cache's rows are "
                "chosen by block_table; cache_batch_idx is for contiguous caches)"
            )
        capacity = dbt[1][1] * slots
    else:
        if dbidx is None and rows < b:
            raise ValueError(
                f"k_cache: batch_cache {rows} is smaller than q's batch {b} (shape "
                f"{fmt_shape(dkc[1])}): each sequence needs a cache row (pass a cache of at "
                f"least {b} rows, or cache_batch_idx to choose them)"
            )
        capacity = slots

    sn = 0
    if (dk is None) != (dv is None):
        given, missing = ("k", "v") if dv is None else ("v", "k")
        raise ValueError(f"{missing}: must be given with {given} (new keys and values together)")
    if dk is not None and dv is not None:
        layout = "(batch, seqlen_new, nheads_k, headdim)"
        for arg, dn in (("k", dk), ("v", dv)):
            rank(arg, dn, (4,), layout)
            same_dtype(arg, dn, "q", dq, "q, k_cache, v_cache, k and v must share one dtype")
            same_device(arg, dn, "q", dq)
        sn = dk[1][1]
        shape_eq("k", dk, (b, sn, hk, d), f"{layout} to go with q and k_cache")
        shape_eq("v", dv, tuple(dk[1]), f"{layout} like k")
        if sn > capacity:
            raise ValueError(
                f"k: seqlen_new {sn} is more than the cache holds ({capacity} positions)"
            )

    if (dcos is None) != (dsin is None):
        given, missing = ("rotary_cos", "rotary_sin")
        if dcos is None:
            given, missing = missing, given
        raise ValueError(f"{missing}: must be given with {given} (rotary needs both)")
    if dcos is not None and dsin is not None:
        layout = "(seqlen_ro, rotary_dim / 2)"
        rank("rotary_cos", dcos, (2,), layout)
        allowed = (dq[3], "float32") if dq[3] != "float32" else ("float32",)
        dtype_in("rotary_cos", dcos, allowed)
        same_device("rotary_cos", dcos, "q", dq)
        rank("rotary_sin", dsin, (2,), layout)
        same_dtype("rotary_sin", dsin, "rotary_cos", dcos)
        shape_eq("rotary_sin", dsin, tuple(dcos[1]), f"{layout} like rotary_cos")
        same_device("rotary_sin", dsin, "q", dq)
        seqlen_ro, half = dcos[1]
        if half < 1 or 2 * half > d:
            raise ValueError(
                f"rotary_cos: rotary_dim {2 * half} (twice its last dimension, shape "
                f"{fmt_shape(dcos[1])}) must be in [2, headdim={d}]"
            )
        if seqlen_ro < capacity:
            raise ValueError(
                f"rotary_cos: seqlen_ro {seqlen_ro} is shorter than the cache's capacity "
                f"{capacity} (shape {fmt_shape(dcos[1])}; cos/sin must cover every position "
                f"the cache can hold, as in flash-attn)"
            )
        contiguous_last("rotary_cos", dcos, "rotary_dim / 2")
        contiguous_last("rotary_sin", dsin, "rotary_dim / 2")

    if dseq is not None:
        _batch_index("cache_seqlens", dseq, b, dq)
    if dbidx is not None:
        _batch_index("cache_batch_idx", dbidx, b, dq)
    if dpad is not None:
        _batch_index("cache_leftpad", dpad, b, dq)

    for arg, dn, dim in (
        ("q", dq, "headdim"),
        ("k_cache", dkc, "headdim"),
        ("v_cache", dvc, "headdim"),
        ("k", dk, "headdim"),
        ("v", dv, "headdim"),
    ):
        if dn is not None:
            contiguous_last(arg, dn, dim)
    return b, sq, h, d, hk, sn, capacity, paged, slots, rows


def cache_seqlens_int(value: Any, seqlen_new: int, capacity: int) -> int:
    """An int cache_seqlens (Python or NumPy integer): 0 <= value <= capacity - seqlen_new."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"cache_seqlens: expected an int or an int32 array of shape (batch,), got {value!r}"
        )
    n = int(value)
    if n < 0 or n + seqlen_new > capacity:
        raise ValueError(
            f"cache_seqlens: {n} is not allowed: cache_seqlens + seqlen_new ({n} + "
            f"{seqlen_new}) must be in [0, {capacity}], the cache's capacity"
        )
    return n


def kvcache_values(
    lens: np.ndarray,
    seqlen_new: int,
    seqlen_q: int,
    capacity: int,
    pad: np.ndarray | None,
    bidx: np.ndarray | None,
    rows: int,
    block_table: np.ndarray | None,
    block_size: int,
    seqlen_ro: int | None,
) -> None:
    """The values inside the int32 index tensors, read on the host (the GPU path only reads
    them when FLASHSCAN_CHECK_INDICES=1: it costs a host synchronisation). `lens` is
    cache_seqlens as (batch,) ints. Nothing outside the cache is read or written when these
    pass; rows appended to must not collide."""
    lens = lens.astype(np.int64)
    end = lens + seqlen_new
    bad = np.flatnonzero((lens < 0) | (end > capacity))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"cache_seqlens: cache_seqlens[{i}] = {int(lens[i])} is out of range: with "
            f"seqlen_new {seqlen_new} it must be in [0, {capacity - seqlen_new}] (the cache "
            f"holds {capacity} positions per sequence)"
        )
    start = np.zeros_like(lens)
    if pad is not None:
        start = pad.astype(np.int64)
        bad = np.flatnonzero((start < 0) | (start > lens))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"cache_leftpad: cache_leftpad[{i}] = {int(start[i])} is out of range: it must "
                f"be in [0, cache_seqlens[{i}] = {int(lens[i])}]"
            )
    if seqlen_ro is not None:
        last = lens - start + max(seqlen_new, seqlen_q) - 1
        bad = np.flatnonzero(last >= seqlen_ro)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"rotary_cos: seqlen_ro {seqlen_ro} is too short: sequence {i} needs rotary "
                f"position {int(last[i])}"
            )
    if bidx is not None:
        idx = bidx.astype(np.int64)
        bad = np.flatnonzero((idx < 0) | (idx >= rows))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"cache_batch_idx: cache_batch_idx[{i}] = {int(idx[i])} is out of range "
                f"[0, {rows}) (k_cache has {rows} rows)"
            )
        if seqlen_new and np.unique(idx).size != idx.size:
            raise ValueError(
                f"cache_batch_idx: names one cache row twice ({idx.tolist()}) while k/v are "
                f"appended: two sequences would write the same slots"
            )
    if block_table is not None:
        bt = block_table.astype(np.int64)
        used = (end + block_size - 1) // block_size  # blocks read per sequence
        for b in range(bt.shape[0]):
            ids = bt[b, : int(used[b])]
            bad = np.flatnonzero((ids < 0) | (ids >= rows))
            if bad.size:
                j = int(bad[0])
                raise ValueError(
                    f"block_table: block_table[{b}, {j}] = {int(ids[j])} is out of range "
                    f"[0, {rows}) (k_cache has {rows} blocks; sequence {b} reads its first "
                    f"{int(used[b])} blocks)"
                )
        if seqlen_new:
            pos = lens[:, None] + np.arange(seqlen_new)[None, :]
            blocks = np.take_along_axis(bt, pos // block_size, axis=1)
            slot = blocks * block_size + pos % block_size
            if np.unique(slot).size != slot.size:
                raise ValueError(
                    "block_table: two sequences append into the same cache slots (their "
                    "block_table rows share a block at the positions k/v are written to)"
                )


def nonnegative_int(arg: str, value: Any) -> int:
    """A Python or NumPy int >= 0 (bools are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{arg}: expected an int >= 0, got {value!r}")
    if int(value) < 0:
        raise ValueError(f"{arg}: expected an int >= 0, got {int(value)}")
    return int(value)


_memo_kvcache: dict[Any, tuple[int, int, int, int, int, int, int, bool, int, int]] = {}


def kvcache_memo(
    dq: Desc,
    dkc: Desc,
    dvc: Desc,
    dk: Desc | None,
    dv: Desc | None,
    dcos: Desc | None,
    dsin: Desc | None,
    dseq: Desc | None,
    dbidx: Desc | None,
    dpad: Desc | None,
    dbt: Desc | None,
) -> tuple[int, int, int, int, int, int, int, bool, int, int]:
    """`kvcache`, remembered per signature (a decode loop repeats one signature per step)."""
    descs = (dq, dkc, dvc, dk, dv, dcos, dsin, dseq, dbidx, dpad, dbt)
    key = tuple(d and d[1:] for d in descs)
    r = _memo_kvcache.get(key)
    if r is None:
        r = kvcache(*descs)
        remember(_memo_kvcache, key, r)
    return r


# ---------------------------------------------------------------------------------------------
# Causal conv1d
# ---------------------------------------------------------------------------------------------

CONV_WIDTHS = (2, 3, 4)


def conv_activation(activation: Any) -> bool:
    """causal-conv1d's activation: None (identity) or "silu" / "swish". True for SiLU."""
    if activation is None:
        return False
    if not isinstance(activation, str):
        raise TypeError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    if activation not in ("silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    return True


def _conv_weight(dx: Desc, dw: Desc, db: Desc | None) -> int:
    """weight (dim, width) in x's dtype or float32, width 2..4; bias (dim,) like weight."""
    dim = dx[1][1]
    rank("weight", dw, (2,), "(dim, width)")
    _bc_dtype("weight", dw, "x", dx)
    width = dw[1][1]
    if dw[1][0] != dim:
        raise ValueError(f"weight: expected shape (dim={dim}, width), got {fmt_shape(dw[1])}")
    if width not in CONV_WIDTHS:
        raise UnsupportedError(f"weight: width {width} is not supported (allowed: 2, 3, 4)")
    same_device("weight", dw, "x", dx)
    if db is not None:
        rank("bias", db, (1,), "(dim,)")
        same_dtype("bias", db, "weight", dw)
        shape_eq("bias", db, (dim,), "(dim,)")
        same_device("bias", db, "x", dx)
    return width


def conv_layout(arg: str, d: Desc) -> str:
    """'cf' when the seqlen axis of a (batch, dim, seqlen) array is contiguous (causal-conv1d's
    default), 'cl' when its dim axis is (the channel-last layout, x.transpose(1, 2) of a
    contiguous (batch, seqlen, dim)); anything else is refused."""
    shape, strides = d[1], d[2]
    if shape[2] <= 1 or strides[2] == 1 or 0 in shape:
        return "cf"
    if shape[1] <= 1 or strides[1] == 1:
        return "cl"
    raise ValueError(
        f"{arg}: must be contiguous along seqlen (stride(2) == 1) or along dim (stride(1) == 1, "
        f"channel-last), got strides {fmt_shape(strides)} for shape {fmt_shape(shape)} "
        f"(call .contiguous() first)"
    )


def causal_conv1d(
    dx: Desc,
    dw: Desc,
    db: Desc | None,
    dinit: Desc | None,
    dseq: Desc | None,
    return_final_states: bool,
) -> tuple[int, int, int, int]:
    """causal-conv1d's causal_conv1d_fn shapes. Returns (batch, dim, seqlen, width)."""
    rank("x", dx, (3,), "(batch, dim, seqlen)")
    device_kind("x", dx)
    dtype_in("x", dx)
    conv_layout("x", dx)
    batch, dim, seqlen = dx[1]
    width = _conv_weight(dx, dw, db)
    if dinit is not None:
        rank("initial_states", dinit, (3,), "(batch, dim, width - 1)")
        same_dtype("initial_states", dinit, "x", dx)
        shape_eq("initial_states", dinit, (batch, dim, width - 1), "(batch, dim, width - 1)")
        same_device("initial_states", dinit, "x", dx)
    if dseq is not None:
        if dinit is not None or return_final_states:
            raise ValueError(
                "seq_idx: cannot be combined with initial_states or return_final_states "
                "(as in causal-conv1d)"
            )
        rank("seq_idx", dseq, (2,), "(batch, seqlen)")
        dtype_in("seq_idx", dseq, ("int32",))
        shape_eq("seq_idx", dseq, (batch, seqlen), "(batch, seqlen)")
        same_device("seq_idx", dseq, "x", dx)
    return batch, dim, seqlen, width


def causal_conv1d_update(
    dx: Desc, dstate: Desc, dw: Desc, db: Desc | None, dlens: Desc | None
) -> tuple[int, int, int, int, int]:
    """causal-conv1d's causal_conv1d_update shapes. Returns (batch, dim, seqlen, state_len,
    width); seqlen is 1 for a 2-D x."""
    n = rank("x", dx, (2, 3), "(batch, dim) or (batch, dim, seqlen)")
    device_kind("x", dx)
    dtype_in("x", dx)
    batch, dim = dx[1][0], dx[1][1]
    seqlen = dx[1][2] if n == 3 else 1
    width = _conv_weight(dx, dw, db)
    rank("conv_state", dstate, (3,), "(batch, dim, state_len)")
    same_dtype("conv_state", dstate, "x", dx)
    state_len = dstate[1][2]
    shape_eq("conv_state", dstate, (batch, dim, state_len), "(batch, dim, state_len)")
    if state_len < width - 1:
        raise ValueError(
            f"conv_state: state_len {state_len} must be >= width - 1 = {width - 1} "
            f"(shape {fmt_shape(dstate[1])})"
        )
    same_device("conv_state", dstate, "x", dx)
    if dlens is not None:
        rank("cache_seqlens", dlens, (1,), "(batch,)")
        dtype_in("cache_seqlens", dlens, ("int32",))
        shape_eq("cache_seqlens", dlens, (batch,), "(batch,)")
        same_device("cache_seqlens", dlens, "x", dx)
    return batch, dim, seqlen, state_len, width


# Mamba-2 SSD chunked scan
# ---------------------------------------------------------------------------------------------

INT_DTYPES = ("int32", "int64")


def dt_limit(value: Any) -> tuple[float, float]:
    """mamba_ssm's dt_limit: (low, high) reals, low <= high; infinities allowed."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"dt_limit: expected a (low, high) pair of numbers, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, (bool, str, bytes)):
            raise TypeError(f"dt_limit: expected a (low, high) pair of numbers, got {value!r}")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(
                f"dt_limit: expected a (low, high) pair of numbers, got {value!r}"
            ) from None
        if math.isnan(f):
            raise ValueError(f"dt_limit: NaN is not allowed, got {value!r}")
        out.append(f)
    if out[0] > out[1]:
        raise ValueError(f"dt_limit: low must be <= high, got {value!r}")
    return out[0], out[1]


def positive_int(arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{arg}: expected an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{arg}: expected an int >= 1, got {value!r}")
    return int(value)


def ssd(
    dx: Desc,
    ddt: Desc,
    dA: Desc,
    dB: Desc,
    dC: Desc,
    dD: Desc | None,
    dz: Desc | None,
    dbias: Desc | None,
    dinit: Desc | None,
    dseq: Desc | None,
    dcu: Desc | None,
    return_varlen_states: bool,
    floats: tuple[str, ...] = FLOAT_DTYPES,
) -> tuple[int, int, int, int, int, int]:
    """mamba_ssm's mamba_chunk_scan_combined shapes. `floats`: the allowed float dtypes (the
    torch adapter adds float64, which runs the reference). Returns
    (batch, seqlen, nheads, headdim, ngroups, dstate)."""
    layout = "(batch, seqlen, nheads, headdim)"
    rank("x", dx, (4,), layout)
    device_kind("x", dx)
    dtype_in("x", dx, floats)
    batch, seqlen, nheads, headdim = (int(s) for s in dx[1])
    rank("dt", ddt, (3,), "(batch, seqlen, nheads)")
    dtype_in("dt", ddt, floats)
    shape_eq("dt", ddt, (batch, seqlen, nheads), "(batch, seqlen, nheads)")
    same_device("dt", ddt, "x", dx)
    rank("A", dA, (1,), "(nheads,)")
    dtype_in("A", dA, floats)
    shape_eq("A", dA, (nheads,), "(nheads,)")
    same_device("A", dA, "x", dx)
    bc_layout = "(batch, seqlen, ngroups, dstate)"
    rank("B", dB, (4,), bc_layout)
    dtype_in("B", dB, floats)
    same_device("B", dB, "x", dx)
    ngroups, dstate = int(dB[1][2]), int(dB[1][3])
    if dB[1][0] != batch or dB[1][1] != seqlen:
        raise ValueError(
            f"B: expected shape (batch={batch}, seqlen={seqlen}, ngroups, dstate) {bc_layout}, "
            f"got {fmt_shape(dB[1])}"
        )
    if ngroups < 1 or nheads % ngroups:
        raise ValueError(
            f"B: ngroups {ngroups} must divide nheads {nheads} (shape {fmt_shape(dB[1])})"
        )
    if dstate < 1:
        raise ValueError(f"B: dstate must be >= 1, got shape {fmt_shape(dB[1])}")
    rank("C", dC, (4,), bc_layout)
    same_dtype("C", dC, "B", dB)
    shape_eq("C", dC, dB[1], "(like B)")
    same_device("C", dC, "x", dx)
    if dD is not None:
        rank("D", dD, (1, 2), "(nheads,) or (nheads, headdim)")
        dtype_in("D", dD, floats)
        if tuple(dD[1]) not in ((nheads,), (nheads, headdim)):
            raise ValueError(
                f"D: expected shape ({nheads},) or ({nheads}, {headdim}) (nheads,) or "
                f"(nheads, headdim), got {fmt_shape(dD[1])}"
            )
        same_device("D", dD, "x", dx)
    if dz is not None:
        rank("z", dz, (4,), layout)
        same_dtype("z", dz, "x", dx)
        shape_eq("z", dz, dx[1], "(like x)")
        same_device("z", dz, "x", dx)
    if dbias is not None:
        rank("dt_bias", dbias, (1,), "(nheads,)")
        dtype_in("dt_bias", dbias, floats)
        shape_eq("dt_bias", dbias, (nheads,), "(nheads,)")
        same_device("dt_bias", dbias, "x", dx)
    if dinit is not None:
        st_layout = "(batch, nheads, headdim, dstate)"
        rank("initial_states", dinit, (4,), st_layout)
        dtype_in("initial_states", dinit, floats)
        shape_eq("initial_states", dinit, (batch, nheads, headdim, dstate), st_layout)
        same_device("initial_states", dinit, "x", dx)
    if dseq is not None:
        rank("seq_idx", dseq, (2,), "(batch, seqlen)")
        dtype_in("seq_idx", dseq, INT_DTYPES)
        shape_eq("seq_idx", dseq, (batch, seqlen), "(batch, seqlen)")
        same_device("seq_idx", dseq, "x", dx)
    if return_varlen_states:
        if dcu is None:
            raise ValueError("cu_seqlens: required when return_varlen_states=True")
        rank("cu_seqlens", dcu, (1,), "(num_sequences + 1,)")
        dtype_in("cu_seqlens", dcu, INT_DTYPES)
        if dcu[1][0] < 2:
            raise ValueError(
                "cu_seqlens: expected at least 2 entries (num_sequences + 1), got shape "
                f"{fmt_shape(dcu[1])}"
            )
        same_device("cu_seqlens", dcu, "x", dx)
        if batch != 1:
            raise ValueError(
                f"cu_seqlens: varlen states need batch 1 (sequences packed along seqlen), got "
                f"x of shape {fmt_shape(dx[1])}"
            )
    return batch, seqlen, nheads, headdim, ngroups, dstate


def ssd_cu_seqlens_values(cu: np.ndarray, seqlen: int) -> None:
    """cu_seqlens on the host: starts at 0, never decreases, ends at seqlen."""
    v = np.asarray(cu).reshape(-1)
    if int(v[0]) != 0 or int(v[-1]) != seqlen or bool(np.any(np.diff(v) < 0)):
        raise ValueError(
            f"cu_seqlens: expected non-decreasing offsets from 0 to seqlen={seqlen}, got "
            f"{v.tolist() if v.size <= 16 else str(v[:8].tolist()) + '...'}"
        )
