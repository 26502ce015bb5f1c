"""The FP8 attention forward's Python layer on the CPU (`flash_attn_func` with float8_e4m3fn
torch tensors and flash-attn 3's descales): the dequantised reference path, the bfloat16 output,
the descales' broadcasting, and clear errors for what it refuses. (The e4m3 kernel itself:
tests/test_fp8_gpu.py and tests/test_fp8_compile.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import flashscan
from flashscan import reference

torch = pytest.importorskip("torch")


def _inputs(b=2, sq=37, sk=53, h=4, hk=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q8, k8, v8 = (
        (torch.randn(b, s, n, d, generator=g) * 3).to(torch.float8_e4m3fn)
        for s, n in ((sq, h), (sk, hk), (sk, hk))
    )
    qd, kd, vd = (torch.rand(b, hk, generator=g) + 0.5 for _ in range(3))
    return q8, k8, v8, qd, kd, vd


def _dequant(x8, ds, hk):
    x = x8.to(torch.float64)
    if ds is not None:
        per = ds.to(torch.float64).reshape(-1, hk).expand(x.shape[0], hk)
        x = x * per.repeat_interleave(x.shape[2] // hk, dim=1)[:, None, :, None]
    return x.numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_fp8_runs_the_reference_on_dequantised_inputs(causal):
    q8, k8, v8, qd, kd, vd = _inputs()
    o, lse = flashscan.flash_attn_func(
        q8, k8, v8, causal=causal, return_lse=True, q_descale=qd, k_descale=kd, v_descale=vd
    )
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape
    ref, ref_lse = reference.flash_attn_func(
        _dequant(q8, qd, 2),
        _dequant(k8, kd, 2),
        _dequant(v8, vd, 2),
        causal=causal,
        return_lse=True,
    )
    err = np.abs(o.to(torch.float64).numpy() - ref).max()
    assert err <= 2**-7 * np.abs(ref).max(), err  # bfloat16's rounding of the output
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-5, atol=1e-5)


def test_descales_broadcast_and_default_to_one():
    q8, k8, v8, qd, kd, vd = _inputs(b=1, hk=1, h=2)
    plain = flashscan.flash_attn_func(q8, k8, v8)
    ones = flashscan.flash_attn_func(q8, k8, v8, q_descale=torch.ones(1), k_descale=torch.ones(()))
    assert plain.dtype == torch.bfloat16
    assert torch.equal(plain, ones)
    # a scalar v descale scales the output (exactly, up to the bf16 rounding of the result)
    two = flashscan.flash_attn_func(q8, k8, v8, v_descale=torch.full((1, 1), 2.0))
    assert torch.equal(two, (plain.to(torch.float32) * 2).to(torch.bfloat16))


def test_fp8_refuses_what_it_cannot_take():
    q8, k8, v8, qd, kd, vd = _inputs()
    qb = q8.to(torch.bfloat16)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        flashscan.flash_attn_func(qb, k8, v8, q_descale=qd)
    with pytest.raises(ValueError, match="q_descale has shape"):
        flashscan.flash_attn_func(q8, k8, v8, q_descale=torch.ones(3, 5))
    with pytest.raises(TypeError, match="float32"):
        flashscan.flash_attn_func(q8, k8, v8, k_descale=kd.to(torch.float64))
    with pytest.raises(ValueError, match="bfloat16"):
        flashscan.flash_attn_func(q8, k8, v8, out=torch.empty(q8.shape, dtype=torch.float16))
    with pytest.raises(ValueError, match="nheads"):
        flashscan.flash_attn_func(q8[:, :, :3], k8, v8)
    with pytest.raises(TypeError, match="torch tensors"):
        flashscan.flash_attn_func(q8.to(torch.float32).numpy(), k8, v8, q_descale=qd)
