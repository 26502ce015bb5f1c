"""Save every gradient of a few 16-bit SSD backward calls without z (the dc16 / db16 / dstate16
kernels) to argv[1] (.npz), seeded: two wheels' files compare bitwise (compare mode: argv = a b)."""

import sys

import numpy as np

if len(sys.argv) == 3 and sys.argv[1].endswith(".npz") and sys.argv[2].endswith(".npz"):
    a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
    bad = [k for k in a.files if not np.array_equal(a[k], b[k], equal_nan=True)]
    for k in bad:
        d = np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))
        print(f"DIFFERS {k}: max abs {d.max():.3e}")
    print(f"{len(a.files) - len(bad)} of {len(a.files)} arrays bitwise equal")
    sys.exit(1 if bad else 0)

import torch

import flashscan.torch as fst

CASES = [  # b, L, h, p, g, n, dtype, chunk, seq_idx cuts
    (8, 2048, 80, 64, 1, 128, torch.bfloat16, 256, None),
    (2, 1000, 6, 64, 2, 64, torch.float16, 128, None),
    (2, 600, 4, 64, 1, 64, torch.float16, 256, (0, 1, 5, 200, 256, 300, 511)),
    (2, 333, 4, 42, 2, 21, torch.bfloat16, 64, None),
    (32, 60, 8, 64, 1, 64, torch.bfloat16, 256, None),
    (1, 700, 4, 128, 1, 128, torch.bfloat16, 128, None),
]
out = {}
for ci, (b, L, h, p, g, n, dt, chunk, cuts) in enumerate(CASES):
    gen = torch.Generator(device="cuda").manual_seed(1234 + ci)

    def rnd(*s, scale=1.0, dtype=dt, gen=gen):
        return (torch.randn(*s, device="cuda", generator=gen) * scale).to(dtype)

    a = {
        "x": rnd(b, L, h, p),
        "dt": (torch.rand(b, L, h, device="cuda", generator=gen) * 2 - 2.5),
        "A": -torch.exp(torch.rand(h, device="cuda", generator=gen) * 2 - 1),
        "B": rnd(b, L, g, n, scale=n**-0.25),
        "C": rnd(b, L, g, n, scale=n**-0.25),
        "D": torch.randn(h, device="cuda", generator=gen),
        "dt_bias": torch.rand(h, device="cuda", generator=gen) * 0.5,
        "initial_states": torch.randn(b, h, p, n, device="cuda", generator=gen) * 0.5,
    }
    kw = {}
    if cuts is not None:
        starts = torch.tensor(cuts, device="cuda")
        si = (torch.arange(L, device="cuda")[:, None] >= starts).sum(-1) - 1
        kw["seq_idx"] = torch.stack([si, torch.zeros_like(si)]).to(torch.int32)
    lv = {k: v.clone().requires_grad_(True) for k, v in a.items()}
    o, fin = fst.mamba_chunk_scan_combined(
        **lv, chunk_size=chunk, dt_softplus=True, return_final_states=True, **kw
    )
    dout = rnd(*o.shape)
    dfin = torch.randn(fin.shape, device="cuda", generator=gen)
    gs = torch.autograd.grad([o, fin], list(lv.values()), [dout, dfin])
    for k, gr in zip(lv, gs):
        out[f"c{ci}_{k}"] = gr.float().cpu().numpy()
np.savez(sys.argv[1], **out)
print("saved", len(out), "arrays")
