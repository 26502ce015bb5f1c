"""The Rust core without a GPU: DLPack import of numpy arrays, descriptor tuples, capsules,
and the attention argument checks (which run before any device is touched)."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip("flashscan._native")


def test_describe_numpy_view_keeps_strides_and_pointer() -> None:
    a = np.random.default_rng().standard_normal((3, 8), dtype=np.float32)
    v = a[:, ::2]
    d = _native.describe(v)
    assert d["device_type"] == 1
    assert d["dtype"] == "float32"
    assert d["shape"] == (3, 4)
    assert d["strides"] == (8, 2)  # elements, not bytes
    assert d["data_ptr"] == v.__array_interface__["data"][0]


def test_describe_capsule_and_descriptor() -> None:
    a = np.ones((2, 5), dtype=np.float16)
    d = _native.describe(a.__dlpack__())
    assert d["shape"] == (2, 5) and d["dtype"] == "float16"
    d = _native.describe((4096, (2, 3), (3, 1), "bfloat16", 2, 1))
    assert d == {
        "device_type": 2,
        "device_id": 1,
        "dtype": "bfloat16",
        "shape": (2, 3),
        "strides": (3, 1),
        "data_ptr": 4096,
        "readonly": False,
    }


def test_readonly_numpy_is_reported_or_refused() -> None:
    a = np.ones(4, dtype=np.float32)
    a.flags.writeable = False
    try:
        d = _native.describe(a)
    except ValueError as e:  # numpy < 2.1 refuses to export read-only arrays
        assert "__dlpack__" in str(e)
    else:
        assert d["readonly"] is True


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (object(), TypeError, "must be a tensor that supports DLPack"),
        (np.ones(3, dtype=np.int16), TypeError, "unsupported DLPack dtype"),
        ((1, (2,), (1, 1), "float32", 2, 0), ValueError, "shape and strides"),
        ((1, (2,), (1,), "int8", 2, 0), TypeError, "unsupported dtype"),
        ((1, 2), TypeError, "descriptor tuple"),
    ],
)
def test_describe_rejects_bad_input(bad: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _native.describe(bad)


def _qkv(b=2, sq=5, sk=7, h=4, hk=2, d=64, dtype=np.float16):
    rng = np.random.default_rng()
    q = rng.standard_normal((b, sq, h, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    return q, k, v, np.empty_like(q)


def _fwd(q, k, v, out, lse=None, window=(-1, -1), softcap=0.0):
    _native.flash_attn_fwd(q, k, v, out, lse, 0.125, window[0], window[1], softcap, 0)


def test_attention_checks_name_the_argument() -> None:
    q, k, v, out = _qkv()
    with pytest.raises(TypeError, match="k has dtype float32"):
        _fwd(q, k.astype(np.float32), v, out)
    with pytest.raises(ValueError, match=r"q must have shape \(batch, seqlen_q, nheads, headdim\)"):
        _fwd(q[0], k, v, out)
    with pytest.raises(ValueError, match="multiple of nheads_k"):
        q3, k3, v3, o3 = _qkv(h=3, hk=2)
        _fwd(q3, k3, v3, o3)
    with pytest.raises(_native.UnsupportedError, match="headdim = 264"):
        _fwd(*_qkv(d=264))
    with pytest.raises(_native.UnsupportedError, match="headdim = 20"):
        _fwd(*_qkv(d=20))
    with pytest.raises(ValueError, match="v must have shape"):
        _fwd(q, k, v[:, :3], out)
    with pytest.raises(ValueError, match="contiguous in its headdim"):
        qq = np.empty((2, 5, 4, 128), dtype=np.float16)[..., ::2]
        _fwd(qq, k, v, out)
    with pytest.raises(ValueError, match="lse must have shape"):
        _fwd(q, k, v, out, lse=np.empty((2, 4, 6), dtype=np.float32))
    with pytest.raises(ValueError, match="window_size"):
        _fwd(q, k, v, out, window=(-2, 0))
    with pytest.raises(ValueError, match="softcap"):
        _fwd(q, k, v, out, softcap=-1.0)
    with pytest.raises(ValueError, match="out overlaps q"):
        _fwd(q, k, v, q)


def test_attention_on_cpu_arrays_is_refused_by_the_gpu_entry() -> None:
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        _fwd(*_qkv())


def test_status_never_raises() -> None:
    s = _native.backend_status()
    assert isinstance(s["available"], bool)
    if not s["available"]:
        assert s["reason"]
    assert s["cache_dir"]
