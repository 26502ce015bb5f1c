"""The profiled call (ncu): the selective-scan forward + backward through flashscan.torch at
b d L (dstate 16, bf16, D, z, bias, softplus), three steps."""

import sys

import torch

import flashscan.torch as fst


def main() -> None:
    b, d, length, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), 16
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s: int) -> torch.Tensor:
        return torch.randn(*s, device="cuda", generator=g)

    dt = torch.bfloat16
    leaves = [
        rnd(b, d, length).to(dt),
        (rnd(b, d, length) * 0.5 - 1).to(dt),
        -torch.rand(d, n, device="cuda", generator=g) * 2 - 0.1,
        rnd(b, 1, n, length).to(dt),
        rnd(b, 1, n, length).to(dt),
    ]
    leaves = [t.requires_grad_() for t in leaves]
    D, z, bias = rnd(d), rnd(b, d, length).to(dt), rnd(d) * 0.1
    dout = rnd(b, d, length).to(dt)
    for _ in range(3):
        y = fst.selective_scan_fn(*leaves, D, z, bias, delta_softplus=True)
        torch.autograd.grad(y, leaves, dout)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
