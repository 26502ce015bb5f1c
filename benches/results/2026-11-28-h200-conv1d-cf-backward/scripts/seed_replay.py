"""Replay the 7x7 sm90 backward draw (seed from stop 19) on the TMA, cp.async and mma.sync
builds; compare dk bit for bit; then a sweep of seeds counting rule failures per build. Run from
the repo root on the GPU machine. (Its inputs come from make_qkv, which seeds from Python's
`random`: unseeded when this ran, so the replay drew fresh inputs; see the README.)"""

import os
import sys

sys.path.insert(0, "tests")
import conftest  # noqa: F401
import test_backward_gpu as t
import torch
from conftest import Rule

SEED = 3434922452882669254
CASE = (2, 7, 7, 2, 2, 64, "bfloat16", False, (-1, -1), 0.0)
BUILDS = {
    "tma": {"FLASHSCAN_SM90_BWD": "1", "FLASHSCAN_SM90_BWD_TMA": "1"},
    "cp.async": {"FLASHSCAN_SM90_BWD": "1", "FLASHSCAN_SM90_BWD_TMA": "0"},
    "mma.sync": {"FLASHSCAN_SM90_BWD": "0"},
}


def run(seed, build):
    for k in ("FLASHSCAN_SM90_BWD", "FLASHSCAN_SM90_BWD_TMA"):
        os.environ.pop(k, None)
    os.environ.update(BUILDS[build])
    torch.manual_seed(seed)
    b, sq, sk, h, hk, d, dt, causal, window, cap = CASE
    dtype = t.DTYPES[dt]
    q, k, v = t.make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = torch.randn(b, sq, h, d, device="cuda").to(dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = t.fst.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=cap)
    got = torch.autograd.grad(out, leaves, dout)
    ref = t.attention_grads(q, k, v, dout, causal, window, cap, upcast=True)
    base = t.attention_grads(q, k, v, dout, causal, window, cap, upcast=False)
    res = {}
    for name, g, r, bs in zip(("dq", "dk", "dv"), got, ref, base):
        gg, rr, bb = Rule.to_f64(g), Rule.to_f64(r), Rule.to_f64(bs)
        err, berr = Rule.max_err(gg, rr), Rule.max_err(bb, rr)
        limit = 2 * berr + 1e-4 * max(1.0, float(abs(rr).max()))
        res[name] = (err, berr, limit)
    return got, res


got = {}
for bname in BUILDS:
    g, res = run(SEED, bname)
    got[bname] = g
    print(
        bname,
        {
            k: f"err {v[0]:.4e} base {v[1]:.4e} limit {v[2]:.4e} {'FAIL' if v[0] > v[2] else 'ok'}"
            for k, v in res.items()
        },
    )
for a in ("cp.async", "mma.sync"):
    for i, n in enumerate(("dq", "dk", "dv")):
        x, y = got["tma"][i], got[a][i]
        diff = (x.float() - y.float()).abs().max().item()
        print(
            f"tma vs {a} {n}: bit-identical {torch.equal(x, y)}, max |diff| {diff:.4e}, "
            f"n differ {(x != y).sum().item()}"
        )
# dk twice on the same build: deterministic?
g2, _ = run(SEED, "tma")
print(
    "tma rerun dk identical:",
    torch.equal(g2[1], got["tma"][1]),
    "dq identical:",
    torch.equal(g2[0], got["tma"][0]),
)
N = int(os.environ.get("SWEEP", "300"))
for bname in BUILDS:
    fails = {"dq": 0, "dk": 0, "dv": 0}
    worst = {"dq": 0.0, "dk": 0.0, "dv": 0.0}
    for s in range(N):
        _, res = run(s, bname)
        for k, (e, _, lim) in res.items():
            fails[k] += e > lim
            worst[k] = max(worst[k], e / lim)
    rounded = {k: round(v, 3) for k, v in worst.items()}
    print(f"sweep {N} seeds {bname}: fails {fails} worst err/limit {rounded}")
