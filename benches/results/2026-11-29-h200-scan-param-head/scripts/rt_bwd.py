"""The profiled call of call 2: three flashscan.torch training steps (forward + backward of the
selective scan, b ARGV[1] d512 L60 dstate 16 bf16, D, z, delta_bias, softplus, varying B / C)."""

import sys

import torch

import flashscan.torch as fst

b, d, L, n = int(sys.argv[1]), 512, 60, 16
g = torch.Generator(device="cuda").manual_seed(0)


def r(*s: int) -> torch.Tensor:
    return torch.randn(*s, device="cuda", generator=g)


dt = torch.bfloat16
u = r(b, d, L).to(dt)
delta = (r(b, d, L) * 0.5 - 1).to(dt)
A = -torch.rand(d, n, device="cuda", generator=g) * 2 - 0.1
B = r(b, 1, n, L).to(dt)
C = r(b, 1, n, L).to(dt)
D = r(d)
z = r(b, d, L).to(dt)
bias = r(d) * 0.1
leaves = [t.requires_grad_() for t in (u, delta, A, B, C, D, z, bias)]
dout = r(b, d, L).to(dt)
for _ in range(3):
    y = fst.selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    gr = torch.autograd.grad(y, leaves, dout)
torch.cuda.synchronize()
