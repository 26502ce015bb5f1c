"""torch tensors read through torch's DLPack C exchange table (src/torch_exchange.rs) and the
native scan server built on it (src/serve/), without a GPU: the table's struct
layout is ours to get right, so every field a read gives is compared with torch's own
accessors; the server must refuse what it cannot plan and leave no Python error behind."""

from __future__ import annotations

from typing import Any

import pytest

_native = pytest.importorskip("flashscan._native")
torch = pytest.importorskip("torch")

if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
    pytest.skip("this torch publishes no DLPack C exchange table", allow_module_level=True)

# (code, bits) of DLPack dtypes: float 2, bfloat 4, int 0
_DL = {
    torch.float32: (2, 32),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
    torch.float64: (2, 64),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
}


def _tensors() -> list[Any]:
    base = torch.randn(3, 4, 5)
    return [
        base,
        base[:, 1:, ::2],  # an offset view with strides
        base.transpose(0, 2),
        torch.zeros(2, dtype=torch.bfloat16),
        torch.ones((), dtype=torch.float16),  # 0-d
        torch.empty(0, 7),  # empty
        torch.nn.Parameter(torch.randn(4, 2)),
        torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),
        torch.randn(2, 3, dtype=torch.float64).expand(4, 2, 3),  # a zero stride
        torch.randn(1, 1, 1, 1, 1, 1, 1, 2),  # 8 dims: the most a read keeps
    ]


@pytest.mark.parametrize("i", range(len(_tensors())))
def test_exchange_read_equals_torch_accessors(i: int) -> None:
    t = _tensors()[i]
    r = _native.torch_exchange_read(t)
    assert r is not None
    ptr, shape, strides, (code, bits, lanes), dev_type, dev_id = r
    assert ptr == t.data_ptr()
    assert tuple(shape) == tuple(t.shape)
    assert tuple(strides) == t.stride()
    assert (code, bits, lanes) == (*_DL[t.dtype], 1)
    assert (dev_type, dev_id) == (1, 0)  # kDLCPU


def test_exchange_read_refuses_what_is_no_tensor_or_too_deep() -> None:
    for bad in (object(), 1.5, None, "x", [1, 2]):
        assert _native.torch_exchange_read(bad) is None
    assert _native.torch_exchange_read(torch.randn([1] * 9)) is None  # more than 8 dims


def _scan_args(dtype: Any = torch.bfloat16) -> list[Any]:
    b, d, L, n = 2, 8, 5, 4
    return [
        torch.randn(b, d, L).to(dtype),
        torch.rand(b, d, L).to(dtype),
        -torch.rand(d, n),
        torch.randn(b, n, L).to(dtype),
        torch.randn(b, n, L).to(dtype),
        torch.randn(d),
        None,
        None,
        None,
    ]


def test_scan_server_refuses_and_remembers_cpu_signatures() -> None:
    """CPU tensors are never planned (planning needs a CUDA device): refused once, remembered
    (no second planning attempt), and never served; no Python error is left set."""
    srv = _native.ScanServer(torch.Tensor, torch.is_grad_enabled, torch.float32)
    assert srv  # the Python layer tests its truth: an empty server is still one
    args = _scan_args()
    assert srv.serve(*args, True, False, False) is None  # not learning: nothing looked up
    assert srv.plan_count() == 0
    assert srv.serve(*args, True, False, True) is None
    assert srv.plan_count() == 1
    assert srv.serve(*args, True, False, True) is None
    assert srv.serve(*args, True, False, False) is None
    assert srv.plan_count() == 1
    # another signature (flags are part of it)
    assert srv.serve(*args, False, False, True) is None
    assert srv.plan_count() == 2


def test_scan_server_refuses_non_bool_flags_non_tensors_and_autograd() -> None:
    srv = _native.ScanServer(torch.Tensor, torch.is_grad_enabled, torch.float32)
    args = _scan_args()
    for flags in ((1, False), (True, None), ("yes", False)):
        assert srv.serve(*args, *flags, True) is None
    assert srv.plan_count() == 0
    bad = list(args)
    bad[0] = bad[0].numpy() if bad[0].dtype != torch.bfloat16 else object()
    assert srv.serve(*bad, True, False, True) is None
    # a grad-requiring input with grad mode on: flashscan.torch's call, nothing planned
    grad = list(args)
    grad[2] = torch.nn.Parameter(grad[2])
    assert srv.serve(*grad, True, False, True) is None
    assert srv.plan_count() <= 1  # the non-tensor call may be kept as refused, nothing else
    with torch.no_grad():
        srv.serve(*grad, True, False, True)
    assert srv.plan_count() <= 2


def test_state_update_server_refuses_cpu_signatures() -> None:
    srv = _native.StateUpdateServer(torch.Tensor)
    assert srv
    b, d, n = 2, 8, 4
    args = [
        torch.randn(b, d, n),
        torch.randn(b, d),
        torch.randn(b, d),
        -torch.rand(d, n),
        torch.randn(b, n),
        torch.randn(b, n),
        None,
        None,
        None,
    ]
    assert srv.serve(*args, True, False) is None
    assert srv.plan_count() == 0
    assert srv.serve(*args, True, True) is None
    assert srv.serve(*args, True, True) is None
    assert srv.plan_count() == 1
    assert srv.serve(*args, 1, True) is None  # a non-bool flag: the Python layer's
    assert srv.plan_count() == 1


def test_conv_update_server_refuses_cpu_signatures_and_unknown_activations() -> None:
    srv = _native.ConvUpdateServer(torch.Tensor)
    assert srv
    x, state, w = torch.randn(2, 8), torch.randn(2, 8, 3), torch.randn(8, 4)
    assert srv.serve(x, state, w, None, None, "silu", False) is None
    assert srv.plan_count() == 0
    assert srv.serve(x, state, w, None, None, "silu", True) is None
    assert srv.plan_count() == 1  # refused: a CPU signature
    for act in ("relu", 1, "SiLU"):  # the Python layer's to judge
        assert srv.serve(x, state, w, None, None, act, True) is None
    assert srv.plan_count() == 1
    assert srv.serve(x, state, w, None, None, None, True) is None
    assert srv.plan_count() == 2


def test_ssd_server_refuses_cpu_signatures_varlen_and_odd_flags() -> None:
    import math

    srv = _native.SsdServer(torch.Tensor, torch.is_grad_enabled, torch.float32)
    assert srv
    b, L, h, p, g, n = 1, 8, 2, 4, 1, 4
    t = [
        torch.randn(b, L, h, p),
        torch.rand(b, L, h),
        -torch.rand(h),
        torch.randn(b, L, g, n),
        torch.randn(b, L, g, n),
    ]
    opt = [None, None, None, None, None]  # D, z, dt_bias, initial_states, seq_idx

    def call(
        chunk: Any = 4, cu: Any = None, lim: Any = (0.0, math.inf), varlen: Any = False
    ) -> Any:
        return srv.serve(*t, chunk, *opt, cu, True, lim, False, varlen, True)

    assert call() is None
    assert srv.plan_count() == 1  # a CPU signature: refused, remembered
    for bad in (
        {"chunk": True},
        {"chunk": 4.0},
        {"cu": torch.tensor([0, 8], dtype=torch.int32)},
        {"lim": [0.0, 1.0]},
        {"lim": (0.0,)},
        {"varlen": True},
    ):
        assert call(**bad) is None, bad
    assert srv.plan_count() == 1
