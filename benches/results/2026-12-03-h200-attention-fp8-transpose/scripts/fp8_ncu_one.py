"""The profiled process (ncu): FP8 forwards at b4 s4096 h16 d128 (the mode from the environment)."""

import sys

import torch

import flashscan

sys.path.insert(0, "benches")
from fp8_attention import quantize  # noqa: E402

b, s, h, d = 4, 4096, 16, 128
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
q8, qd = quantize(q, h)
k8, kd = quantize(k, h)
v8, vd = quantize(v, h)
for _ in range(3):
    flashscan.flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
torch.cuda.synchronize()
