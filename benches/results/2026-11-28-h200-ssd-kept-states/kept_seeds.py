"""Stop 24: what reading the forward's 16-bit H_c in the backward's df sums costs in accuracy.
For each case and seed: every gradient's max error over its limit under the correctness rule
(tests/conftest.py: 2 x the same-precision baseline's error + atol + rtol x max |ref|), with the
kept states (default) and with the recompute (FLASHSCAN_SSD_KEEP_STATES=0), on the same inputs.
python kept_seeds.py (from the repository root, flashscan importable, a GPU)."""

import os
import random
import sys

import numpy as np
import torch

sys.path.insert(0, "tests")
os.environ["FLASHSCAN_SSD_BWD"] = "2"
import test_ssd_gpu as T  # noqa: E402
from conftest import max_err, to_f64  # noqa: E402

# (dtype, ngroups, dstate, headdim, seqlen, chunk, D per channel): test_backward_matrix's
# 16-bit cases with a state term
CASES = [
    ("float16", 2, 64, 64, 100, 256, True),
    ("float16", 1, 128, 64, 1000, 256, False),
    ("bfloat16", 1, 16, 64, 1000, 128, False),
    ("bfloat16", 1, 128, 128, 300, 256, False),
]
WATCH = ("dt", "A", "dt_bias")  # the gradients the df sums reach
worst = {m: dict.fromkeys(WATCH, 0.0) for m in ("kept", "recompute")}
for case in CASES:
    dt_name, g, n, p, L, chunk, D2 = case
    dtype = T.DTYPES[dt_name]
    for seed in range(1, 11):
        line = []
        grads = {}
        for mode, env in (("kept", "1"), ("recompute", "0")):
            os.environ["FLASHSCAN_SSD_KEEP_STATES"] = env
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            a = T.ssd_inputs(2, L, 4, p, g, n, dtype, D2=D2)
            del a["z"]
            dout, dfinal = T.upstream(a)
            ref = T.ref_grads(a, chunk, dout, dfinal)
            base = T.grads_of(lambda lv, q=chunk: T.baseline_lowp(lv, q, True), a, dout, dfinal)
            got = T.grads_of(T.ours(a, chunk), a, dout, dfinal)
            grads[mode] = got
            rat = {}
            for k in ref:
                gg, r, bb = to_f64(got[k]), to_f64(ref[k]), to_f64(base[k])
                lim = 2 * max_err(bb, r) + 1e-6 + T.GRAD_RTOL[dtype] * float(np.abs(r).max())
                rat[k] = max_err(gg, r) / lim
            for k in WATCH:
                worst[mode][k] = max(worst[mode][k], rat[k])
            line.append(f"{mode} " + " ".join(f"d{k} {rat[k]:.2f}" for k in WATCH))
            line.append(f"(max {max(rat.values()):.2f} d{max(rat, key=rat.get)})")
        # how far the two modes' gradients are apart (0 for those the df sums do not reach)
        apart = {
            k: float((grads["kept"][k].float() - grads["recompute"][k].float()).abs().max())
            / max(float(grads["recompute"][k].float().abs().max()), 1e-30)
            for k in grads["kept"]
        }
        line.append("kept vs recompute " + " ".join(f"d{k} {v:.1e}" for k, v in apart.items()))
        print(f"{dt_name} g{g} n{n} p{p} L{L} c{chunk} seed {seed}: " + " | ".join(line))
for mode, w in worst.items():
    print(f"worst ratio, {mode}: " + " ".join(f"d{k} {v:.2f}" for k, v in w.items()))
