"""The profiled call (ncu): the selective-scan forward at b d L (dstate 16, bf16, D, z,
bias, softplus), three calls."""

import sys

import torch

import flashscan


def main() -> None:
    b, d, length, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), 16
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s: int) -> torch.Tensor:
        return torch.randn(*s, device="cuda", generator=g)

    dt = torch.bfloat16
    u = rnd(b, d, length).to(dt)
    delta = (rnd(b, d, length) * 0.5 - 1).to(dt)
    A = -torch.rand(d, n, device="cuda", generator=g) * 2 - 0.1
    B = rnd(b, 1, n, length).to(dt)
    C = rnd(b, 1, n, length).to(dt)
    D = rnd(d)
    z = rnd(b, d, length).to(dt)
    bias = rnd(d) * 0.1
    for _ in range(3):
        flashscan.selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
