"""One hd256 backward for ncu (-s 1 -c 1 profiles the second launch)."""

import torch

import flashscan.torch as fst

b, s, h, d = 8, 2048, 8, 256
q, k, v = (
    torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(3)
)
out = fst.flash_attn_func(q, k, v)
dout = torch.randn_like(out)
for _ in range(2):
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
