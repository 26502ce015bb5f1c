"""Any device, any current device: tensors on cuda:1 while cuda:0 is current (and the reverse),
per-device modules and plans, the stream of the tensor's device, the caller's current device
unchanged after a call, CUDA graphs captured on cuda:1, threads driving two GPUs at once, cupy
and jax arrays on a non-default device, and mixed devices rejected before any launch.

The mixed-device checks run on CPU too (descriptor tuples naming two CUDA devices reach the
checks without a GPU). The GPU tests need two GPUs and skip with the reason elsewhere.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import flashscan
from flashscan import _checks
from flashscan._backend import native

torch = pytest.importorskip("torch")

from test_attention_gpu import check_attention, make_qkv  # noqa: E402

CUDA = 2  # DLPack device type of a descriptor


def _two_gpus() -> None:
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {n}")


_NEXT_PTR = [1 << 20]


def _desc(shape: tuple[int, ...], device_id: int, dtype: str = "bfloat16") -> tuple[Any, ...]:
    """A fake CUDA descriptor (pointer, shape, contiguous strides, dtype, device): what the
    checks read, never dereferenced because the checks stop the call first. Each gets its own
    address range (the overlap check comes first)."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.insert(0, acc)
        acc *= s
    ptr = _NEXT_PTR[0]
    _NEXT_PTR[0] += 1 << 24
    return (ptr, shape, tuple(strides), dtype, CUDA, device_id)


# ---------------------------------------------------------------------------------------------
# Mixed devices: rejected with the names of both arguments (CPU, no GPU needed)
# ---------------------------------------------------------------------------------------------


def test_python_checks_reject_two_cuda_devices() -> None:
    q = _desc((1, 8, 2, 64), 0)
    k = _desc((1, 8, 2, 64), 1)
    with pytest.raises(ValueError, match=r"k: is on cuda:1 but q is on cuda:0"):
        _checks.attention(q, k, q)
    with pytest.raises(ValueError, match=r"v: is on cuda:1 but q is on cuda:0"):
        _checks.attention(q, q, k)


@pytest.mark.skipif(native is None, reason="the native module is not built")
def test_native_rejects_two_cuda_devices_before_any_launch() -> None:
    """The Rust op trusts nothing from Python: descriptors on two devices stop at its device
    check, before the runtime is even asked for (so this runs where no driver exists)."""
    q, v, out = (_desc((1, 8, 2, 64), 0) for _ in range(3))
    k = _desc((1, 8, 2, 64), 1)
    with pytest.raises(ValueError, match=r"k is on cuda:1 but q is on cuda:0"):
        native.flash_attn_fwd(q, k, v, out, None, 0.125, -1, -1, 0.0, 0)
    lse = _desc((1, 2, 8), 1, "float32")
    with pytest.raises(ValueError, match=r"lse is on cuda:1 but q is on cuda:0"):
        native.flash_attn_fwd(q, v, v, out, lse, 0.125, -1, -1, 0.0, 0)


# ---------------------------------------------------------------------------------------------
# Two GPUs
# ---------------------------------------------------------------------------------------------


def _same_model() -> bool:
    return torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1)


@pytest.mark.gpu
@pytest.mark.parametrize("current,target", [(0, 1), (1, 0)])
def test_attention_on_the_other_device(current: int, target: int, rule: Any) -> None:
    """Tensors on `target` while `current` is the current device: the result is right, on
    `target`, bit-identical to the same call on the current device (same kernel, same GPU
    model), and the current device is unchanged afterwards (the hot path twice, too)."""
    _two_gpus()
    torch.cuda.set_device(current)
    try:
        q, k, v = make_qkv(2, 300, 300, 8, 2, 128, torch.bfloat16, device=f"cuda:{target}")
        for _ in range(3):  # general path, then the per-signature plan
            out, lse = flashscan.flash_attn_func(q, k, v, causal=True, return_lse=True)
            assert torch.cuda.current_device() == current
        assert out.device == q.device and lse.device == q.device
        torch.cuda.synchronize(target)
        check_attention(rule, q, k, v, out, lse, True, (-1, -1), 0.0)
        if _same_model():
            here = [t.to(f"cuda:{current}") for t in (q, k, v)]
            o2 = flashscan.flash_attn_func(*here, causal=True)
            assert torch.equal(o2.cpu(), out.cpu())
        # a torch allocation with no device lands on the caller's device, not ours
        assert torch.empty(1, device="cuda").device.index == current
    finally:
        torch.cuda.set_device(0)


@pytest.mark.gpu
def test_backward_and_scan_on_cuda1_while_cuda0_is_current(rule: Any) -> None:
    """The kernels that allocate stream-ordered scratch (attention backward, chunked scan and
    its backward) on cuda:1 with cuda:0 current: gradients equal the same call on cuda:0."""
    _two_gpus()
    torch.cuda.set_device(0)
    import flashscan.torch as fst

    def grads(dev: str) -> list[Any]:
        g = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(1, 700, 4, 64, generator=g) for _ in range(3))
        q, k, v = (t.to(dev, torch.bfloat16).requires_grad_() for t in (q, k, v))
        u = torch.randn(2, 16, 1000, generator=g).to(dev).requires_grad_()
        delta = (torch.rand(2, 16, 1000, generator=g) * 0.5).to(dev).requires_grad_()
        A = (-torch.rand(16, 8, generator=g) - 0.2).to(dev).requires_grad_()
        B, C = (torch.randn(2, 8, 1000, generator=g).to(dev).requires_grad_() for _ in range(2))
        o = fst.flash_attn_func(q, k, v, causal=True)
        y, last = fst.selective_scan_fn(u, delta, A, B, C, return_last_state=True)
        (o.float().square().sum() + y.square().sum() + last.sum()).backward()
        assert torch.cuda.current_device() == 0
        return [t.grad.float().cpu() for t in (q, k, v, u, delta, A, B, C)]

    on0, on1 = grads("cuda:0"), grads("cuda:1")
    for a, b in zip(on0, on1):
        # the attention backward accumulates dq with atomics: equal up to summation order
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-2 * float(a.abs().max()))


@pytest.mark.gpu
def test_cuda_graph_captured_on_cuda1(rule: Any) -> None:
    _two_gpus()
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 1)
    q, k, v = make_qkv(2, 60, 60, 8, 8, 64, torch.bfloat16, device="cuda:1")
    out = torch.empty_like(q)
    with torch.cuda.device(dev):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up (compile, load on cuda:1) outside the capture
            flashscan.flash_attn_func(q, k, v, causal=True, out=out)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            flashscan.flash_attn_func(q, k, v, causal=True, out=out)
    assert torch.cuda.current_device() == 0
    for _ in range(2):
        nq, nk, nv = make_qkv(2, 60, 60, 8, 8, 64, torch.bfloat16, device="cuda:1")
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(dev)
        check_attention(rule, nq, nk, nv, out, None, True, (-1, -1), 0.0)


@pytest.mark.gpu
def test_threads_drive_two_gpus_at_once() -> None:
    """One thread per GPU, each on its own side stream, calling attention and the scan in a
    loop: every result equals the one computed alone on that GPU beforehand."""
    _two_gpus()

    def work(dev: int) -> tuple[list[Any], Any]:
        d = f"cuda:{dev}"
        g = torch.Generator().manual_seed(dev)
        q, k, v = (torch.randn(1, 512, 8, 128, generator=g).to(d, torch.bfloat16) for _ in range(3))
        u, delta = (torch.randn(1, 32, 2048, generator=g).to(d) for _ in range(2))
        A = -torch.rand(32, 16, generator=g).to(d) - 0.1
        B, C = (torch.randn(1, 16, 2048, generator=g).to(d) for _ in range(2))
        return [q, k, v, u, delta.abs() * 0.1, A, B, C], d

    inputs = [work(0), work(1)]

    def run(args: list[Any]) -> tuple[Any, Any]:
        q, k, v, u, delta, A, B, C = args
        return (
            flashscan.flash_attn_func(q, k, v, causal=True),
            flashscan.selective_scan_fn(u, delta, A, B, C),
        )

    expect = [tuple(t.cpu() for t in run(a)) for a, _ in inputs]
    errors: list[str] = []

    def loop(i: int) -> None:
        args, d = inputs[i]
        try:
            with torch.cuda.device(d), torch.cuda.stream(torch.cuda.Stream(d)):
                for _ in range(50):
                    o, y = run(args)
                torch.cuda.current_stream().synchronize()
            if not (torch.equal(o.cpu(), expect[i][0]) and torch.equal(y.cpu(), expect[i][1])):
                errors.append(f"{d}: result differs from the single-threaded one")
        except Exception as exc:  # reported below with the device
            errors.append(f"{d}: {exc!r}")

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.gpu
def test_cupy_on_cuda1(rule: Any) -> None:
    _two_gpus()
    cupy = pytest.importorskip("cupy")
    q, k, v = make_qkv(1, 100, 100, 4, 4, 64, torch.float16, device="cuda:1")
    with cupy.cuda.Device(1):
        cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
    with cupy.cuda.Device(0):  # the current cupy device is another one
        out = flashscan.flash_attn_func(cq, ck, cv)
    assert out.device.id == 1
    with cupy.cuda.Device(1):
        cupy.cuda.get_current_stream().synchronize()
    check_attention(rule, q, k, v, torch.from_dlpack(out), None, False, (-1, -1), 0.0)


@pytest.mark.gpu
def test_jax_on_a_nondefault_device(rule: Any) -> None:
    _two_gpus()
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        pytest.skip(f"jax sees {len(gpus)} GPUs")
    q, k, v = make_qkv(1, 100, 100, 4, 4, 64, torch.float16, device="cuda:1")
    torch.cuda.synchronize(1)
    jq, jk, jv = (jax.device_put(t.cpu().numpy(), gpus[1]) for t in (q, k, v))
    out = flashscan.flash_attn_func(jq, jk, jv)
    assert out.devices() == {gpus[1]}
    check_attention(rule, q, k, v, torch.from_dlpack(out), None, False, (-1, -1), 0.0)


@pytest.mark.gpu
def test_mixed_cuda_devices_rejected_on_gpus() -> None:
    _two_gpus()
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16, device="cuda:0")
    with pytest.raises(ValueError, match="k: is on cuda:1 but q is on cuda:0"):
        flashscan.flash_attn_func(q, k.to("cuda:1"), v)
    with pytest.raises(ValueError, match="out"):
        flashscan.flash_attn_func(q, k, v, out=torch.empty_like(q, device="cuda:1"))
